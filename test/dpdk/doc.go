// Package dpdk runs vunet against DPDK's testpmd, a second, independent
// vhost-user front-end (virtio-user) whose message order differs from QEMU's:
// it sends SET_MEM_TABLE again after the rings are set up, toggling
// SET_VRING_ENABLE around it, and splits frames over several descriptors.
//
// testpmd bridges its virtio-user port (port 0, connected to vunet's socket)
// to a kernel TAP device (port 1) in io forward mode, so a frame written to
// the TAP by the test reaches vunet's TX ring and vunet's answer comes back
// out of the TAP. The test runs once with memory reserved up front (-m) and
// once with EAL memory that grows after the rings are set up, which makes
// virtio-user send SET_MEM_TABLE again with the rings disabled around it.
//
// # Running
//
//	sudo -E go test ./test/dpdk -run TestTestpmdExchangesFrames -v
//
// It needs root (hugepages, TAP device, packet socket), dpdk-testpmd
// (apt-get install dpdk-dev) and 2 MiB hugepages: the test raises
// /proc/sys/vm/nr_hugepages and mounts hugetlbfs on /dev/hugepages when
// needed, and undoes both afterwards. testpmd runs with --in-memory, so it
// leaves no runtime or hugepage files behind. It busy-polls one core for the
// few seconds the test runs.
//
// Missing prerequisites skip the test, or fail it when CI is set. The
// package reuses vunet/test/qemu's daemon helpers; it holds test helpers and
// tests only and must not be imported by the daemon's packages.
package dpdk

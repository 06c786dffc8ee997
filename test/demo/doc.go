// Command demo is `make demo`: it shows vunet doing its job end to end on
// this machine, in about half a minute, and cleans up after itself.
//
// It builds cmd/vunet and the end-to-end suite's tiny guest (the host's
// kernel, a busybox initramfs and the test agent from test/guest), starts
// vunet with its Prometheus endpoint on a free loopback port, starts a small
// web server on the host's loopback, and boots the guest under QEMU (TCG,
// vectors=0, memfd share=on; the QEMU arguments come from `vunet qemu-args`).
// The guest configures itself by DHCP from vunet and downloads a page from the
// web server through the gateway address, which vunet maps to the host's
// loopback. The demo prints each step as the guest reports it, compares what
// the guest received with what the server sent, prints a few of vunet's
// counters, and exits 0 — or non-zero with the reason and the tails of the
// logs.
//
//	go run ./test/demo            # what `make demo` runs
//	go run ./test/demo -keep      # keep the work directory (logs, console)
//	go run ./test/demo -v         # also show vunet's own log lines
//
// Needs: qemu-system-x86_64 (apt-get install qemu-system-x86), a kernel with
// its modules (linux-image-amd64) and busybox-static. No root.
//
// The package is a test program: it may import the test harness
// (vunet/test/qemu, vunet/test/guest) but it talks to vunet only as a user
// does, through the binary's command line, its socket and its metrics; it
// must not import the daemon's packages. Nothing imports it.
package main

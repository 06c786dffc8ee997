// Command bench is `make bench`: one run measures a vhost-user back-end
// (vunet, and optionally a peer such as passt) on the netns/TAP rig
// (vunet/test/rig) against the kernel's own ceiling, prints a table and
// writes the numbers as JSON.
//
//	go run ./test/bench [-out bench-results.json] [-t 3] [-micro=false]
//	VUNET_BENCH_PEER='passt --vhost-user -f -1 -s {socket}' go run ./test/bench
//
// What it measures, per back-end, with the kernel (a veth pair between two
// namespaces, the same tools) run first in the same run as the ceiling:
//
//   - TCP throughput (iperf3) guest→host and host→guest, 1 and 4 streams, at
//     guest MTU 1500 and 65520, with the back-end's CPU seconds per GB moved
//     (utime+stime of /proc/<pid>/stat around each transfer);
//   - UDP throughput with 1472-byte payloads (iperf3 -u), received rate and
//     loss, both directions, at MTU 1500;
//   - TCP request/response latency (1-byte ping-pong, p50 and p99) and TCP
//     connection setup rate (connect, 1-byte exchange, close), by Go code
//     running on a thread inside the guest namespace;
//   - the back-end's peak RSS (VmHWM), its peak RSS less shared memory
//     (RssAnon + RssFile, without the RssShmem of the rig's memory it
//     touched), and its RSS with N (10,000) idle TCP connections open
//     through it;
//   - Go micro-benchmarks of the hot paths (virtqueue, tcpstack,
//     tcpstack/header, tcpstack/tcp, tcpstack/dgram, tcpstack/stream)
//     with allocs/op.
//
// With VUNET_BENCH_PEER set, every test runs on the peer right after vunet
// and the table gains the ratio vunet/peer per row. The template is split on
// spaces (no quoting); the back-end's CPU and memory are read from the pid
// the rig starts, so the command must exec the back-end, not fork it (passt
// needs -f). passt marks frames to the guest DATA_VALID and leaves their TCP
// checksum out; the rig hands such frames to the guest namespace's kernel as
// trusted, as a virtio guest takes them (vunet/test/rig/lib data_valid.go),
// so passt runs as it would under QEMU, without --pcap. testpmd's TAP
// loses the flag, so its rows run passt with --pcap /dev/null (testpmdPeer).
//
// It needs root, iproute2 and iperf3. It is test code: it may import
// anything, and nothing in vunet may import it.
package main

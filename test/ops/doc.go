// Package ops tests vunet with the tools an operator points at it, as they
// are installed from Debian, not with stand-ins:
//
//   - Prometheus (package prometheus): a real server scrapes vunet's
//     --metrics endpoint every second while a QEMU guest downloads through
//     vunet, and its HTTP query API must show the frame and byte counters
//     rising; `promtool check metrics` must find nothing to lint in a scrape.
//   - Wireshark's tshark (package tshark): a guest's DHCP exchange and TCP
//     handshake must be readable from the file vunet writes with --pcap.
//   - libvirt (packages libvirt-daemon-system, libvirt-clients): a domain
//     built from `vunet libvirt-xml --tcg --domain` boots the test guest
//     with direct kernel boot, its QEMU (run by libvirt as libvirt-qemu)
//     connects to vunet's socket, and the guest reaches a server on the
//     host's loopback through vunet.
//   - libvirt's passt backend (libvirt >= 11.1: bookworm-backports on
//     Debian 12, whose own 9.0 refuses it): libvirtds of the test's own
//     (qemu:///system with libvirt's directories bind-mounted from the
//     test's, and qemu:///session as nobody; in the test's network
//     namespace, with a `passt` symlink to vunet first in their PATH) start
//     vunet as passt for <interface type='vhostuser'> and <interface
//     type='user'> with <backend type='passt'/>, and each guest takes its
//     lease and downloads a blob byte-exact through it.
//
// The guest is the end-to-end suite's (built by package vunet/test/qemu): the host's
// kernel, a busybox initramfs and the test agent, which prints VUNET-RESULT
// lines on a serial port.
//
// Every test needs root (network namespaces keep the daemon's view of "the
// host" and its servers private; libvirtd runs as root) and its tool. When
// one is missing the test is skipped with an apt-get hint, or fails with
// the same hint when CI is set, so CI cannot pass by skipping. Each test
// takes 15–40 s, TestLibvirtdPasstBackend (four guests) about a minute.
//
//	go test ./test/ops -v -count=1
//	go test ./test/ops -run Libvirt -v
//
// The package holds tests only; it may import the test harness but talks to
// vunet only through its binary, socket, metrics and files. Nothing imports it.
package ops

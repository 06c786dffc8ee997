// Command vunet is a vhost-user network back-end: QEMU (or any vhost-user
// front-end) connects to its UNIX socket and the guest's Ethernet frames are
// translated to native host sockets.
//
// The command owns flags (vunet's own long flags and the subset of passt's
// that libvirt, KubeVirt and scripts pass), wiring, signals and logging; the
// work is done by vhostuser (control plane) and tcpstack (data plane).
//
// Start-up opens everything that needs the file system or privileges (the
// socket, forwarded ports, metrics listener, log, pcap and pid files), then
// the isolation package confines the process (README "Security") before it
// serves.
//
// Shutdown: SIGTERM or SIGINT closes the front-end connection, resets every
// host TCP connection (RST: the guest side is gone, so an orderly FIN could
// never be followed by the guest's remaining data), closes UDP and ICMP
// sockets, removes the socket and the pid file (through the sandbox's
// keeper, which kept the rights to) and exits 0, within 2 s.
//
// Imports point one way: cmd/vunet may import vhostuser, tcpstack, metrics
// and virtqueue; none of them may import it. Its subpackages (portspec,
// pcap, isolation, logfile, pidfile) import nothing of vunet's.
package main

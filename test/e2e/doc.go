// Package e2e runs vunet against a real vhost-user front-end: QEMU 7.2
// booting a Linux guest. The machinery (daemon, guest image, QEMU, QMP,
// network namespace, traffic server) is package vunet/test/qemu, which the
// DPDK, demo and operator suites share; this package holds only tests.
//
// # Running
//
//	go test ./test/e2e -run TestQEMUGuestLinkUp -v
//	go test ./test/e2e -v -count=1          # all QEMU tests, no test cache
//	go test -short ./...                    # unit tests only: e2e tests skip
//
// Each test builds nothing twice: cmd/vunet is built once per test binary
// (or taken from VUNET_E2E_BIN), the guest image (with the agent) once per
// binary and cached across runs under $XDG_CACHE_HOME/vunet-e2e (keyed by a
// hash of every input; delete the directory to force a rebuild). A guest
// boots in about 3 s under TCG; a test takes 5–45 s, the whole package
// about 4¼ minutes on two cores. Tests run one at a time: TCG needs a core
// per guest, and two at a time (measured: 3m24s instead of 4m14s) made each
// transfer half again as slow and puts the restart tests' 5 s deadlines at
// the mercy of the neighbour's load.
//
// # Tests
//
//   - TestQEMUGuestLinkUp: handshake, eth0 up, probe frames completed by
//     vunet and seen in its debug log, ARP answered, --one-off exit.
//   - TestQEMUGuestDHCP, TestQEMUGuestDHCPFlags: the lease equals the
//     namespace's "host" configuration (address, prefix, gateway, DNS,
//     search list, MTU 65520), respectively what -a/-n/-g/-D/-m set;
//     SLAAC in the IPv6 prefix and the DHCPv6 address (the agent's own
//     Rapid Commit client) equal the host's, respectively the configured;
//     at MTU 9000, UDP datagrams the guest fragments are echoed whole.
//   - TestQEMUGuestIPv6: SLAAC from router advertisements, UDP echo through
//     the link-local router, then 100 MB down and 100 MB up through the
//     link-local router and through the global router address, byte-exact.
//   - TestQEMUGuestTCPTransfer: 100 MB down and up over IPv4 through the
//     gateway (mapped to the host's loopback), SHA-256 on both ends.
//   - TestQEMUGuestUDPEcho: 20 datagrams from 1 to 65000 bytes, all echoed.
//   - TestQEMUGuestPing: ICMP echo to the gateway through a ping socket.
//   - TestQEMUGuestTCPConnections: 500 TCP connections open at once, one
//     byte echoed on each.
//   - TestQEMUGuestPowerOffStreaming: the guest powers off with a download,
//     an upload and a datagram stream still running and 200 connections
//     closing: the device reset takes the rings back from vunet under
//     traffic, and QEMU must exit.
//   - TestQEMUGuestInboundForward: -t HOST:GUEST, 20 MB from the host to a
//     guest listener, byte-exact.
//   - TestQEMUGuestHTTPDownload: a 32 MB HTTP download through the gateway.
//   - TestQEMUAddressPolicy: hand-built SYNs, datagrams and pings to every
//     loopback spelling (and from 127.0.0.1), mapping on and --no-map-gw:
//     host loopback listeners see nothing, the guest no answer, every probe
//     is a vunet_policy_drops_total; the mapped gateway still works.
//   - TestQEMUHotplugNIC: a NIC hot-plugged over QMP after boot, used (DHCP,
//     20 MB), unplugged, and a second one plugged into the same daemon.
//   - TestQEMUBackendRestart, TestQEMUDaemonConnects: vunet killed and
//     restarted under a running guest, in server mode (QEMU reconnect=1)
//     and in client mode (--connect, QEMU server=on); the guest's TCP round
//     trips must resume within 5 s of the new daemon, then DHCP and a
//     transfer work.
//   - TestQEMUFrontendRestart: QEMU killed in the middle of a 100 MB
//     download; the dead guest's host connection must end, and a new guest
//     on the same socket gets DHCP and byte-exact transfers.
//   - TestQEMUGuestARPFlood: 5000 ARP round trips, rings wrapping many
//     times; exact counts on both sides (plus one gratuitous ARP and one RA
//     per queue-pair start).
//   - TestQEMUStopCont: QMP stop/cont twice under traffic; the rings resume
//     from the indices vunet returned.
//   - TestQEMUGuestMultiQueue: two queue pairs, two vCPUs; both pairs run.
//   - TestQEMUDropInLibvirt, TestQEMUDropInQEMUNetdevPasst: vunet started as
//     passt with the exact command lines of libvirt 9.0.0, 11.3.0 and
//     master and of QEMU 10.1's -netdev passt (package vunet/test/callers):
//     the command returns 0 once the daemon serves, the pid file names the
//     daemon, the guest's lease carries what the options said, a 4 MB
//     download arrives whole (and, for libvirt 11.3.0, a forwarded port
//     reaches the guest), and the daemon leaves with its front-end.
//
// The traffic tests run the daemon and the host-side servers
// (TrafficServer: bulk DOWN/UP with digests, TCP echo, UDP echo) in a
// private network namespace (NewNetNS) that holds a known "host"
// configuration on a veth pair: the results do not depend on the
// machine's own network, ping sockets are allowed there without touching
// the host's net.ipv4.ping_group_range, and forwarded ports cannot
// collide. Those tests need root.
//
// # What the host needs
//
//   - qemu-system-x86_64 (Debian: apt-get install qemu-system-x86). Always run
//     with -accel tcg; vectors=0 on virtio-net-pci (QEMU 7.2 TCG + MSI-X +
//     vhost-user crashes); memory-backend-memfd with share=on.
//   - a kernel and its modules: /boot/vmlinuz-* and /lib/modules/<version>
//     (apt-get install linux-image-amd64), readable by the test user.
//   - busybox-static as /bin/busybox (apt-get install busybox-static).
//   - the go tool (the agent and the daemon are built at test time).
//   - root and ip(8) (iproute2) for the tests that use a network namespace.
//
// When a prerequisite is missing the test is skipped with an install hint,
// or fails with the same hint when the CI environment variable is set, so
// CI cannot go green by skipping.
//
// # Environment
//
//   - VUNET_E2E_BIN: use this daemon binary instead of building ./cmd/vunet.
//   - VUNET_E2E_QEMU: QEMU binary (default qemu-system-x86_64 from PATH).
//   - VUNET_E2E_PASST: run this passt binary (--vhost-user) instead of vunet,
//     to tell harness bugs from daemon bugs; vunet-specific log assertions
//     are skipped.
//   - VUNET_E2E_KEEP=1: keep each test's work directory (logs, serial
//     output) and print its path.
//
// # Reading a failure
//
// Every test dumps, when it fails, the tail of the daemon's log, QEMU's
// stderr, the guest console and the agent's result lines. The agent reports
// one line per check, "VUNET-RESULT name=<check> ok=<0|1> key=value…" (see
// package vunet/test/guest for the checks and their fields).
//
// The guest kernel (Debian's 6.1.192) can hang in its poweroff after a
// test's last check, whatever the back-end: ksoftirqd/0 soft-locked in
// virtio_net's virtnet_poll / free_old_xmit_skbs, once device_shutdown has
// broken the virtqueues. The agent takes its links down before it powers
// off so that nothing polls the broken queues (test/guest/agent,
// poweroff.go, says why); a guest console with that backtrace means the
// agent did not get there.
//
// The package holds tests only; it may import anything in the module.
package e2e

// Package e2e runs vunet against real vhost-user front-ends: QEMU 7.2 booting
// a Linux guest (this package's tests), and, through the exported helpers,
// DPDK's testpmd (package vunet/test/dpdk).
//
// # Running
//
//	go test ./test/e2e -run TestQEMUGuestLinkUp -v
//	go test ./test/e2e -v -count=1          # all QEMU tests, no test cache
//	go test -short ./...                    # unit tests only: e2e tests skip
//
// Each test builds nothing twice: cmd/vunet is built once per test binary
// (or taken from VUNET_E2E_BIN), the guest image once per binary and cached
// across runs under $XDG_CACHE_HOME/vunet-e2e (keyed by a hash of every
// input; delete the directory to force a rebuild). A guest boots in about
// 5–6 s under TCG; a test takes 10–30 s.
//
// # Tests
//
//   - TestQEMUGuestLinkUp: handshake, eth0 up, probe frames completed by
//     vunet and seen in its debug log, ARP answered, --one-off exit.
//   - TestQEMUHotplugNIC: NIC hot-plugged through QMP after boot.
//   - TestQEMUBackendRestart, TestQEMUDaemonConnects: vunet killed and
//     restarted under a running guest, in server mode (QEMU reconnect=1) and
//     in client mode (--connect, QEMU server=on).
//   - TestQEMUGuestARPFlood: 5000 ARP round trips, rings wrapping many
//     times; exact counts on both sides.
//   - TestQEMUStopCont: QMP stop/cont twice under traffic; the rings resume
//     from the indices vunet returned.
//   - TestQEMUGuestMultiQueue: two queue pairs, two vCPUs; both pairs run.
//   - TestQEMUGuestDHCP, TestQEMUGuestIPv6, TestQEMUGuestPing,
//     TestQEMUGuestHTTPDownload: the guest configures itself by DHCP and by
//     SLAAC from router advertisements, pings the gateway, downloads a blob
//     from the host's loopback through the gateway address. They fail until
//     the daemon has DHCP, NDP, ICMP and TCP translation; run them against the
//     reference back-end with VUNET_E2E_PASST to check the harness itself.
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
//
// No root is needed for the QEMU tests, except TestQEMUGuestPing when
// net.ipv4.ping_group_range excludes the test's group (it widens the range
// for its duration as root). When a prerequisite is missing the
// test is skipped with an install hint, or fails with the same hint when the
// CI environment variable is set, so CI cannot go green by skipping.
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
// The package holds test helpers and tests only; it may import anything in
// the module but nothing may import it except other test packages.
package e2e

// Package qemu is the machinery of vunet's suites that run real front-ends
// and guests (vunet/test/e2e, vunet/test/dpdk, vunet/test/demo,
// vunet/test/ops): it builds and starts the daemon (StartDaemon, the
// binary built once per test binary or taken from VUNET_E2E_BIN), builds
// the guest image (GuestImage: the host's kernel, busybox and the test
// agent, cached under $XDG_CACHE_HOME/vunet-e2e), boots it under QEMU
// (StartVM) and reads the agent's VUNET-RESULT lines, drives QMP,
// creates private network namespaces with a known "host" configuration
// (NewNetNS), runs the host-side traffic servers (StartTrafficServer),
// collects the daemon's JSON log (LogSink) and scrapes its metrics.
//
// QMP goes through github.com/digitalocean/go-qemu's SocketMonitor (QMP in
// qmp.go wraps it with timeouts, an event drain and a reply gate; see
// there why each is needed).
//
// Missing prerequisites skip or fail through vunet/test/testenv. The
// package is test support: it may import anything in the module, and
// nothing but test packages may import it.
package qemu

// Package guest holds what the in-guest test agent and the host-side tests
// must agree on: the result lines the agent prints on the serial console and
// the kernel command-line parameters that tell it which checks to run.
//
// The agent itself is test/guest/agent (a static binary put into the
// initramfs by test/guest/initramfs). This package is imported by both sides,
// so it must stay free of cgo, of host-only packages and of anything from the
// daemon (vhostuser, virtqueue, tcpstack, metrics, cmd).
package guest

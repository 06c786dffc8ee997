package e2e

import (
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// TestQEMUGuestPowerOffStreaming powers the guest off while a download, an
// upload and a datagram stream still run through the back-end and 200
// connections are closing: the guest's shutdown resets the device while
// the host peers keep sending (SET_STATUS 0, then GET_VRING_BASE for both
// rings with frames to the guest in flight; the guest's own transmissions
// stop a moment before, when the agent takes its link down, see
// test/guest/agent/poweroff.go), QEMU must then exit, and the daemon must
// report no ring error and leave cleanly on SIGTERM.
func TestQEMUGuestPowerOffStreaming(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	d := netDaemon(t, ns)
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckStreaming},
		// 200 connections dialled one after the other took 4.8 s on a
		// loaded machine: room beyond the default 20 s per check.
		Params: map[string]string{
			guest.ParamStreaming: srv.Target(guest.TargetGW4),
			guest.ParamTimeout:   "60s",
		},
	})
	r := vm.RequireResult(t, guest.CheckStreaming, 90*time.Second)
	t.Logf("streaming when the check reported: %s", r.Format())
	vm.Finish(t)
	checkNoRingErrors(t, d)
}

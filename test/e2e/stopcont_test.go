package e2e

import (
	"context"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// arpLoopFor is how long the guest keeps ARPing in TestQEMUStopCont.
const arpLoopFor = 12 * time.Second

// TestQEMUStopCont pauses the VM with QMP "stop" while the guest is
// exchanging frames and resumes it with "cont". QEMU stops the rings
// (GET_VRING_BASE) and sets them up again from the returned indices, so
// vunet must hand back exactly where it was: a lost or repeated index
// shows up as a guest whose link no longer works after "cont".
func TestQEMUStopCont(t *testing.T) {
	qemu.NeedQEMU(t)
	d := qemu.StartDaemon(t, qemu.DaemonConfig{Metrics: true})
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckARPLoop},
		Params: map[string]string{
			guest.ParamAddr:    "10.0.2.15/24",
			guest.ParamARP:     "10.0.2.2",
			guest.ParamARPLoop: arpLoopFor.String(),
			guest.ParamTimeout: "40s",
		},
	})
	vm.RequireResult(t, guest.CheckLink, 60*time.Second)
	time.Sleep(2 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stoppedBefore := len(d.Log.Match(qemu.MsgIs("vring stopped")))
	for i := 0; i < 2; i++ {
		if _, err := vm.QMP.Run(ctx, "stop", nil); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if st, err := vm.QMP.QueryStatus(ctx); err != nil || st.Running || st.Status != "paused" {
			t.Errorf("query-status after stop: %+v, %v", st, err)
		}
		time.Sleep(time.Second)
		if _, err := vm.QMP.Run(ctx, "cont", nil); err != nil {
			t.Fatalf("cont: %v", err)
		}
		if st, err := vm.QMP.QueryStatus(ctx); err != nil || !st.Running {
			t.Errorf("query-status after cont: %+v, %v", st, err)
		}
		time.Sleep(time.Second)
	}
	r := vm.RequireResult(t, guest.CheckARPLoop, arpLoopFor+30*time.Second)
	atoi := func(k string) int { return atoiField(r, k) }
	if last, dur := atoi("last_reply_ms"), atoi("duration_ms"); last < dur-2000 {
		t.Errorf("last ARP reply at %d ms of %d: the link did not survive stop/cont (%s)", last, dur, r.Format())
	}
	if replies, sent := atoi("replies"), atoi("sent"); replies < sent*3/4 {
		t.Errorf("%d replies to %d requests across stop/cont (%s)", replies, sent, r.Format())
	}
	vm.Finish(t)
	if d.Passt {
		return
	}
	// QEMU stops both rings on each "stop".
	if n := len(d.Log.Match(qemu.MsgIs("vring stopped"))) - stoppedBefore; n < 4 {
		t.Errorf("%d rings stopped across two stop/cont cycles, want >= 4: QEMU's GET_VRING_BASE not seen", n)
	}
	m, err := d.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if bad := m.Sum("vunet_vhost_user_errors_total") + m.Sum("vunet_queue_bad_chains_total"); bad != 0 {
		t.Errorf("%v vhost-user errors or bad chains across stop/cont", bad)
	}
	if starts := m.Sum("vunet_vhost_user_sessions_total"); starts != 1 {
		t.Errorf("%v vhost-user sessions: stop/cont must not reconnect", starts)
	}
}

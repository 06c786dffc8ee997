package rig

import (
	"context"
	"testing"
	"time"
)

// TestRigRequestResponseOneFrame: a 1-byte request and its answer through
// vunet are one frame each way, as between two kernels: our ACK for the
// request rides on the answer (tcpstack/tcp/delayed_ack.go), and the
// guest's for the answer on its next request. Without the delayed ACK the
// guest got two frames per round trip, our ACK and then the answer.
func TestRigRequestResponseOneFrame(t *testing.T) {
	r := startRig(t, Options{DHCP: true, MTU: 65520})
	e := rigEnds(r)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := e.dial(ctx, echoOn(t, e))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rt := func() {
		if err := roundTrip(conn); err != nil {
			t.Fatal(err)
		}
	}
	for range 50 {
		rt()
	}
	before := metrics(t, r)
	const n = 2000
	for range n {
		rt()
	}
	after := metrics(t, r)
	delta := func(dir string) float64 {
		return after.Sum("vunet_queue_frames_total", `direction="`+dir+`"`) -
			before.Sum("vunet_queue_frames_total", `direction="`+dir+`"`)
	}
	to, from := delta("to_guest"), delta("from_guest")
	t.Logf("%d round trips: %.0f frames to the guest, %.0f from it", n, to, from)
	// An answer slower than the delay (a loaded machine) costs an ACK of
	// its own: allow one in ten.
	if to < n || to > n*11/10 {
		t.Errorf("%.0f frames to the guest for %d round trips, want one each (at most %d)", to, n, n*11/10)
	}
	healthy(t, r)
}

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

// TestRigCloseOneFrame: a short connection the guest closes first — connect,
// a 1-byte request and answer, close — costs the guest three frames from
// vunet, as from a kernel: the SYN-ACK, the answer (carrying the request's
// ACK), and our FIN carrying the ACK of the guest's (the host peer closes
// on reading the end of the stream). It was five: a window update after
// the handshake and the FIN's ACK went as frames of their own.
func TestRigCloseOneFrame(t *testing.T) {
	r := startRig(t, Options{DHCP: true, MTU: 65520})
	e := rigEnds(r)
	port := echoOn(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exchange := func() {
		conn, err := e.dial(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := roundTrip(conn); err != nil {
			t.Fatal(err)
		}
	}
	// closed waits for vunet's table to empty: both FINs went and were
	// acknowledged.
	closed := func() Metrics {
		t.Helper()
		return waitMetric(t, r, 20*time.Second, func(m Metrics) bool { return m.Sum("vunet_tcp_connections") == 0 })
	}
	for range 20 {
		exchange()
	}
	before := closed()
	const n = 300
	for range n {
		exchange()
	}
	after := closed()
	if c := after.Sum("vunet_tcp_connections"); c != 0 {
		t.Fatalf("%v connections still open 20 s after the last close", c)
	}
	to := after.Sum("vunet_queue_frames_total", `direction="to_guest"`) -
		before.Sum("vunet_queue_frames_total", `direction="to_guest"`)
	t.Logf("%d connections: %.0f frames to the guest", n, to)
	// A peer slower to close than the delay (a loaded machine) costs an
	// ACK of its own: allow one in ten.
	if to < 3*n || to > 3*n+n/10 {
		t.Errorf("%.0f frames to the guest for %d connections, want three each (at most %d)", to, n, 3*n+n/10)
	}
	healthy(t, r)
}

package virtqueue_test

import (
	"testing"

	"vunet/virtqueue"
)

// flushOne publishes one used entry on r's queue.
func flushOne(t *testing.T, r *rig) {
	t.Helper()
	offerN(t, r, 1)
	var c virtqueue.Chain
	if !r.pop(t, &c) {
		t.Fatal("empty")
	}
	r.q.Push(c.Head, 0)
	r.q.Flush()
}

// With signals deferred, Flush decides and SignalPending signals: each
// ring's call eventfd once, whether one ring or both have an interrupt
// pending, and none before.
func TestDeferredSignals(t *testing.T) {
	for _, tc := range []struct {
		name           string
		flushA, flushB bool
	}{
		{"both rings", true, true},
		{"first only", true, false},
		{"second only", false, true},
		{"neither", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newRig(t, rigOpt{size: 16, call: true})
			b := newRig(t, rigOpt{size: 16, call: true})
			a.q.DeferSignals(true)
			b.q.DeferSignals(true)
			for round := 1; round <= 3; round++ {
				if tc.flushA {
					flushOne(t, a)
				}
				if tc.flushB {
					flushOne(t, b)
				}
				if ga, gb := readEventfd(t, a.cfg.Call), readEventfd(t, b.cfg.Call); ga != 0 || gb != 0 {
					t.Fatalf("round %d: call counters %d and %d before SignalPending, want 0", round, ga, gb)
				}
				virtqueue.SignalPending(a.q, b.q)
				ga, gb := readEventfd(t, a.cfg.Call), readEventfd(t, b.cfg.Call)
				if want := b2u(tc.flushA); ga != want {
					t.Fatalf("round %d: first ring's call counter %d, want %d", round, ga, want)
				}
				if want := b2u(tc.flushB); gb != want {
					t.Fatalf("round %d: second ring's call counter %d, want %d", round, gb, want)
				}
				// Nothing stays pending: a second call signals nothing.
				virtqueue.SignalPending(a.q, b.q)
				if ga, gb := readEventfd(t, a.cfg.Call), readEventfd(t, b.cfg.Call); ga != 0 || gb != 0 {
					t.Fatalf("round %d: signalled again (%d, %d)", round, ga, gb)
				}
			}
			if n := a.stats.Notifies.Load(); n != 3*b2u(tc.flushA) {
				t.Fatalf("first ring counted %d notifies, want %d", n, 3*b2u(tc.flushA))
			}
		})
	}
}

// Turning deferral off sends what is pending, and Flush signals at once
// again.
func TestDeferSignalsOffSendsPending(t *testing.T) {
	r := newRig(t, rigOpt{size: 16, call: true})
	r.q.DeferSignals(true)
	flushOne(t, r)
	if got := readEventfd(t, r.cfg.Call); got != 0 {
		t.Fatalf("deferred: call counter %d, want 0", got)
	}
	r.q.DeferSignals(false)
	if got := readEventfd(t, r.cfg.Call); got != 1 {
		t.Fatalf("after DeferSignals(false): call counter %d, want 1", got)
	}
	flushOne(t, r)
	if got := readEventfd(t, r.cfg.Call); got != 1 {
		t.Fatalf("flush after deferral ended: call counter %d, want 1", got)
	}
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

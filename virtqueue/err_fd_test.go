package virtqueue_test

import (
	"errors"
	"testing"

	"vunet/virtqueue"
)

// TestErrFDSignalledWhenBroken: the vring's error eventfd (SET_VRING_ERR)
// is written exactly once when the queue breaks, so the front-end can log
// it; a bad chain, which the queue survives, does not signal it.
func TestErrFDSignalledWhenBroken(t *testing.T) {
	for _, tc := range []struct {
		name    string
		drive   func(r *rig)
		broken  bool
		signals uint64
	}{
		{name: "avail runs ahead", broken: true, signals: 1, drive: func(r *rig) {
			r.d.SetAvailIdx(9) // size 8
		}},
		{name: "head out of range", broken: true, signals: 1, drive: func(r *rig) {
			r.d.PutAvail(8)
			r.d.Publish(false)
		}},
		{name: "bad chain only", signals: 0, drive: func(r *rig) {
			r.d.SetDesc(0, rigMem+4096, 16, 0, 0) // outside guest memory
			r.d.PutAvail(0)
			r.d.Publish(false)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOpt{size: 8})
			errFD := newEventfd(t)
			r.cfg.Err = errFD
			q, err := virtqueue.NewSplitQueue(r.cfg)
			if err != nil {
				t.Fatal(err)
			}
			tc.drive(r)
			var c virtqueue.Chain
			for i := 0; i < 3; i++ { // broken stays broken; signalled once
				_, err = q.Pop(&c)
			}
			if got := errors.Is(err, virtqueue.ErrBroken); got != tc.broken {
				t.Fatalf("Pop err = %v, broken %v want %v", err, got, tc.broken)
			}
			if got := readEventfd(t, errFD); got != tc.signals {
				t.Fatalf("error eventfd counter = %d, want %d", got, tc.signals)
			}
			if got := r.stats.ErrSignals.Load(); got != tc.signals {
				t.Fatalf("ErrSignals = %d, want %d", got, tc.signals)
			}
			if err := q.SignalErr(); err != nil || readEventfd(t, errFD) != 1 {
				t.Fatalf("SignalErr: %v", err)
			}
		})
	}
	// Without an error fd (0 and -1 both mean none), breaking is silent.
	for _, fd := range []int{0, -1} {
		r := newRig(t, rigOpt{size: 8})
		r.cfg.Err = fd
		q, err := virtqueue.NewSplitQueue(r.cfg)
		if err != nil {
			t.Fatal(err)
		}
		r.d.SetAvailIdx(9)
		var c virtqueue.Chain
		if _, err := q.Pop(&c); !errors.Is(err, virtqueue.ErrBroken) {
			t.Fatalf("Err=%d: Pop %v", fd, err)
		}
		if err := q.SignalErr(); err != nil || r.stats.ErrSignals.Load() != 0 {
			t.Fatalf("Err=%d: SignalErr %v, signals %d", fd, err, r.stats.ErrSignals.Load())
		}
	}
}

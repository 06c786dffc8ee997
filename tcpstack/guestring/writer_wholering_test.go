package guestring

import (
	"testing"

	"vunet/tcpstack/stats"
)

// TestMoreLaterWholeRing: with merged buffers, a reservation that ran out
// of chains can grow after the guest's refill, unless it already held
// every entry of the ring, when waiting would never end (a frame larger
// than the guest's whole ring).
func TestMoreLaterWholeRing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size      uint16
		posted    int
		wantLater bool
	}{
		{"ring_half_posted", 16, 8, true},
		{"all_but_one_posted", 8, 7, true},
		{"whole_ring_posted", 8, 8, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ring, _ := newTestRing(t, featMrg, tc.size)
			var w Writer
			w.Init(ring.Q, new(stats.Queue), testLogger, featMrg, true)
			for range tc.posted {
				ring.AddBuffers(nil, 1536)
			}
			ring.Post()
			_, pay, s := w.Reserve(42, 64000)
			if s != OK {
				t.Fatalf("Reserve: %v", s)
			}
			n := 0
			for _, b := range pay {
				n += len(b)
			}
			if n >= 64000 {
				t.Fatalf("a reservation of %d bytes from %d buffers of 1536", n, tc.posted)
			}
			if got := w.MoreLater(); got != tc.wantLater {
				t.Fatalf("MoreLater() = %v after %d bytes from %d of %d entries, want %v", got, n, tc.posted, tc.size, tc.wantLater)
			}
			w.Abort()
		})
	}
}

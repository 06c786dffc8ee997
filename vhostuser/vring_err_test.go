package vhostuser

import (
	"testing"
)

// TestVringErrFD: the SET_VRING_ERR eventfd reaches the queue and is
// written when the guest breaks the ring, so the front-end can report it; a
// new error fd replaces the old one with the pair rebuilt.
func TestVringErrFD(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt bool
		noFD    bool // SET_VRING_ERR with the no-fd flag after the real one
		want    uint64
	}{
		{name: "broken ring signals", breakIt: true, want: 1},
		{name: "healthy ring stays quiet", want: 0},
		{name: "error fd withdrawn", breakIt: true, noFD: true, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuestMem(t, testGPA, testUA, testSize)
			h := newHarness(t, 1)
			defer h.d.close()
			h.negotiate(OfferedProtocolFeatures)
			errFD := eventfd(t)
			defer closeFD(errFD)
			h.ok(ReqSetVringErr, u64(1), dupFD(t, errFD))
			if tc.noFD {
				h.ok(ReqSetVringErr, u64(1|VringNoFDFlag))
			}
			h.dp.onStart = drainPopper
			g.offer(1, 2, false)
			h.setupPair(g, 0, true)
			if tc.breakIt {
				// avail.idx more than the ring size ahead of what was used.
				g.ring(1).SetAvailIdx(2 + testRingSize + 1)
			}
			// A new call fd rebuilds the pair; the data plane pops.
			h.ok(ReqSetVringCall, u64(1), eventfd(t))
			if !h.d.running[0] || g.usedIdx(1) != 2 {
				t.Fatalf("pair running %v, used %d", h.d.running[0], g.usedIdx(1))
			}
			if got := readEventfd(t, errFD); got != tc.want {
				t.Fatalf("error eventfd counter %d, want %d", got, tc.want)
			}
			if got := h.stats.Rings[1].ErrSignals.Load(); got != tc.want {
				t.Fatalf("ring 1 ErrSignals %d, want %d", got, tc.want)
			}
		})
	}
}

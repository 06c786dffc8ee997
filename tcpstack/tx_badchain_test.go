package tcpstack

import (
	"testing"
	"time"
)

// TestTXBadChainsReturned: virtqueue stages a malformed TX chain as used
// (length 0) inside Pop. With no good chain in the same batch, the loop must
// still publish it, or the guest never gets the descriptors back and, after
// Size such chains, TX is dead; and what StopPair leaves must be consistent
// (used.idx == LastAvail) for GET_VRING_BASE.
func TestTXBadChainsReturned(t *testing.T) {
	for _, tc := range []struct {
		name string
		bad  int  // malformed chains posted
		good int  // good chains posted in front of them
		stop bool // StopPair right after posting, without waiting
	}{
		{name: "one", bad: 1},
		{name: "batch", bad: 5},
		{name: "whole-ring", bad: 64},
		{name: "behind-good", good: 2, bad: 3},
		{name: "stop-at-once", bad: 3, stop: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPair(t, featModern, 64)
			p.start()
			for i := 0; i < tc.good; i++ {
				p.addTX(otherFrame(0x88b5, 60))
			}
			for i := 0; i < tc.bad; i++ {
				p.tx.corruptChain(p.addTX(otherFrame(0x88b5, 60)))
			}
			want := uint16(tc.good + tc.bad)
			p.tx.Send()
			if !tc.stop {
				waitFor(t, "bad chains used", 2*time.Second, func() bool { return p.tx.UsedIdx() == want })
			} else {
				waitFor(t, "bad chains popped", 2*time.Second, func() bool { return p.tx.Stats.BadChains.Load() == uint64(tc.bad) })
			}
			p.s.StopPair(0)
			if got := p.tx.Stats.BadChains.Load(); got != uint64(tc.bad) {
				t.Errorf("BadChains = %d, want %d", got, tc.bad)
			}
			if got, last := p.tx.UsedIdx(), p.tx.Q.LastAvail(); got != want || last != want {
				t.Fatalf("after StopPair used.idx = %d, LastAvail = %d, want both %d", got, last, want)
			}
			for i := 0; i < int(want); i++ {
				if _, n, ok := p.tx.popUsed(); !ok || n != 0 {
					t.Fatalf("used element %d: ok=%v len=%d, want len 0", i, ok, n)
				}
			}
			if got := p.stats().TX.Frames.Load(); got != uint64(tc.good) {
				t.Errorf("TX frames = %d, want %d (bad chains are not frames)", got, tc.good)
			}
		})
	}
}

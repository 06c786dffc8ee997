package tcpstack

import (
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
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

// TestTXStopWithBadChainAmongWaiting: a pair stops while its TX batch waits
// for a flow another (stopped) pair holds, and Pop returned a bad chain
// between the waiting frame and a later one. Rewinding both good chains
// would put LastAvail in front of the bad chain, already used: a queue
// rebuilt from it (GET_VRING_BASE) would take and use that chain again.
// The waiting frame, popped before the bad chain, goes back unsent; the one
// behind is given back and sent by the next queue; used.idx ends equal to
// avail.idx, every chain used exactly once.
func TestTXStopWithBadChainAmongWaiting(t *testing.T) {
	for attempt := 1; ; attempt++ {
		if txStopWithBadChainAmongWaiting(t) {
			return
		}
		// The waiting frame was given up (fetchWait) before the stop:
		// a loaded machine; the stop never met the batch it is about.
		if attempt == 5 {
			t.Fatal("5 attempts: the frame's wait always ended before the stop")
		}
	}
}

func txStopWithBadChainAmongWaiting(t *testing.T) (ran bool) {
	pairs := newMQ(t, 2)
	g, _ := mqConnect(t, pairs)
	pairs[0].s.StopPair(0) // the flow's holder
	p := pairs[1]
	st := p.stats()
	// One batch: the connection's segment (it waits for the flow), a
	// malformed chain, a frame of no flow.
	p.addTX(tcpGuestFrame(testGuest4, testGw4, g.sport, g.dport, g.seq, g.ack, header.TCPFlagACK|header.TCPFlagPSH, []byte("first")))
	p.tx.corruptChain(p.addTX(otherFrame(0x88b5, 60)))
	p.addTX(otherFrame(0x88b5, 60))
	p.tx.Send()
	waitFor(t, "the bad chain popped", 2*time.Second, func() bool { return p.tx.Stats.BadChains.Load() == 1 })
	p.s.StopPair(1)
	if st.TX.Drops[stats.DropFlowMoving].Load() != 0 {
		return false
	}
	used, last := p.tx.UsedIdx(), p.tx.Q.LastAvail()
	if used != 2 || last != 2 {
		t.Fatalf("after StopPair used.idx = %d, LastAvail = %d, want both 2 (the waiting frame and the bad chain used, the last frame given back)", used, last)
	}
	if got := st.TX.Drops[stats.DropRingDisabled].Load(); got != 1 {
		t.Errorf("TX drops on a disabled ring = %d, want 1 (the waiting frame)", got)
	}
	frames := st.TX.Frames.Load()
	p.rx.rebuild(2, p.rx.Q.LastAvail()) // pair 1's rings are vrings 2 and 3
	p.tx.rebuild(3, last)
	p.start()
	waitFor(t, "the last frame used", 2*time.Second, func() bool { return p.tx.UsedIdx() >= 3 })
	p.s.StopPair(1)
	if used, last := p.tx.UsedIdx(), p.tx.Q.LastAvail(); used != 3 || last != 3 {
		t.Fatalf("after the restart used.idx = %d, LastAvail = %d, want both 3 (every chain used once)", used, last)
	}
	if got := st.TX.Frames.Load() - frames; got != 1 {
		t.Errorf("the restarted queue handled %d frames, want 1", got)
	}
	return true
}

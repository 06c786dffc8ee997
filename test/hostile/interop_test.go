package hostile

import (
	"testing"
	"time"

	fe "vunet/test/frontend"
)

// These are not attacks: they check that front-end variants real users run
// (QEMU layouts, DPDK's order, multiqueue, no EVENT_IDX, index wrap-around,
// reconnects) work against the server, so the hostile cases above start from
// a known-good baseline.
func TestInteropVariants(t *testing.T) {
	cases := []struct {
		name string
		opts fe.Options
		pair int
		n    int // exchanges
	}{
		{name: "qemu pc layout mem slots", opts: fe.Options{Layout: fe.LayoutPCHole}},
		{name: "qemu pc layout mem table", opts: fe.Options{Layout: fe.LayoutPCHole, MemTable: true}},
		{name: "adjacent regions", opts: fe.Options{Layout: fe.LayoutAdjacent}},
		{name: "dpdk order", opts: fe.Options{Order: fe.OrderDPDK, RingSize: 1024, TXShape: fe.ChainShape{HeaderApart: true}}},
		{name: "no event idx", opts: fe.Options{FeatureMask: fe.DefaultFeatureMask &^ fe.Bit(fe.FeatEventIdx)}},
		{name: "no mergeable buffers", opts: fe.Options{FeatureMask: fe.DefaultFeatureMask &^ fe.Bit(fe.FeatMrgRxbuf)}},
		{name: "ring size 16", opts: fe.Options{RingSize: 16}, n: 40},
		{name: "indices wrap", opts: fe.Options{RingSize: 16, VringBase: 65530}, n: 20},
		{name: "indices wrap without event idx", opts: fe.Options{RingSize: 16, VringBase: 65533, FeatureMask: fe.DefaultFeatureMask &^ fe.Bit(fe.FeatEventIdx)}, n: 20},
		{name: "indirect chains", opts: fe.Options{TXShape: fe.ChainShape{Indirect: true}, RXShape: fe.ChainShape{Indirect: true, HeaderApart: true}}},
		{name: "two pairs, traffic on pair 1", opts: fe.Options{QueuePairs: 2}, pair: 1},
		{name: "ack every message", opts: fe.Options{AckAll: true}},
		{name: "mtu message", opts: fe.Options{MTU: 1500, AckAll: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := startServer(t)
			f := s.connect(t, c.opts)
			p := f.Pairs[c.pair]
			for i := 0; i < max(c.n, 1); i++ {
				exchangeOn(t, p)
			}
			if t.Failed() {
				return
			}
			bases, err := f.Stop()
			if err != nil {
				t.Fatal(err)
			}
			// GET_VRING_BASE is the next avail index the device would
			// process. A stopped pair has pushed every chain it popped and
			// rewound unused RX reservations, so it equals used.idx; on
			// TX every published chain was consumed.
			for i, r := range f.Rings() {
				if uint16(bases[i]) != r.UsedIdx() {
					t.Errorf("ring %d: GET_VRING_BASE %d, used idx %d", i, bases[i], r.UsedIdx())
				}
				if i%2 == 1 && uint16(bases[i]) != r.AvailIdx() {
					t.Errorf("ring %d: GET_VRING_BASE %d, avail idx %d", i, bases[i], r.AvailIdx())
				}
			}
		})
	}
}

// exchangeOn is exchange on any pair.
func exchangeOn(t *testing.T, p *fe.Pair) {
	t.Helper()
	if p.RX.Outstanding() < 2 {
		if err := p.PostRX(min(8, int(p.RX.Size())/2), 2048); err != nil {
			t.Fatalf("post rx: %v", err)
		}
	}
	if err := p.SubmitTX(arpRequest()); err != nil {
		t.Fatalf("submit tx: %v", err)
	}
	frames, err := p.ReceiveRX(3 * time.Second)
	if err != nil {
		t.Fatalf("no ARP reply: %v", err)
	}
	checkARPReply(t, frames[0].Data)
	if err := p.WaitTX(3 * time.Second); err != nil {
		t.Fatalf("tx chains not returned: %v", err)
	}
}

// TestReconnectKeepsRings restarts the session with the same guest memory
// and rings, as QEMU does with reconnect=on: the new session starts each
// ring at its used index and traffic goes on.
func TestReconnectKeepsRings(t *testing.T) {
	s := startServer(t)
	f := s.connect(t, fe.Options{RingSize: 16})
	for i := 0; i < 5; i++ {
		exchange(t, f)
	}
	// A chain left outstanding across the reconnect must be processed by
	// the new session.
	p := f.Pair0()
	if err := p.SubmitTX(arpRequest()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := fe.DialConn(s.path)
		if err == nil {
			c.Timeout = 2 * time.Second
			if err = f.Reconnect(c); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("reconnect: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.WaitTX(3 * time.Second); err != nil {
		t.Fatal(err)
	}
	frames, err := p.ReceiveRX(3 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkARPReply(t, frames[0].Data)
	exchange(t, f)
	if got := s.stats.Sessions.Load(); got != 2 {
		t.Errorf("%d sessions, want 2", got)
	}
}

// TestInterruptSuppression checks the server honours the driver's request
// not to be called: used_event far ahead (EVENT_IDX) or NO_INTERRUPT.
func TestInterruptSuppression(t *testing.T) {
	for _, c := range []struct {
		name string
		mask uint64
	}{
		{"event idx", fe.DefaultFeatureMask},
		{"no interrupt flag", fe.DefaultFeatureMask &^ fe.Bit(fe.FeatEventIdx)},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startServer(t)
			f := s.connect(t, fe.Options{FeatureMask: c.mask})
			p := f.Pair0()
			exchange(t, f)
			if err := p.PostRX(8, 2048); err != nil {
				t.Fatal(err)
			}
			p.TX.DisableInterrupts()
			p.RX.DisableInterrupts()
			p.TX.DrainCall()
			p.RX.DrainCall()
			txUsed, rxUsed := p.TX.UsedIdx(), p.RX.UsedIdx()
			for i := 0; i < 3; i++ {
				if err := p.SubmitTX(arpRequest()); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.TX.WaitUsedIdx(txUsed+3, 3*time.Second); err != nil {
				t.Fatalf("tx not used: %v", err)
			}
			if err := p.RX.WaitUsedIdx(rxUsed+3, 3*time.Second); err != nil {
				t.Fatalf("rx not used: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
			if n := p.TX.DrainCall(); n != 0 {
				t.Errorf("TX call signalled %d times with interrupts disabled", n)
			}
			if n := p.RX.DrainCall(); n != 0 {
				t.Errorf("RX call signalled %d times with interrupts disabled", n)
			}
			if s.stats.Rings[0].NotifiesSuppressed.Load() == 0 || s.stats.Rings[1].NotifiesSuppressed.Load() == 0 {
				t.Errorf("NotifiesSuppressed not counted: rx %d tx %d",
					s.stats.Rings[0].NotifiesSuppressed.Load(), s.stats.Rings[1].NotifiesSuppressed.Load())
			}
			// Re-enabled, the next completion calls again (ReceiveRX
			// re-arms and waits on the call eventfd).
			frames, err := p.ReceiveRX(time.Second)
			if err != nil || len(frames) != 3 {
				t.Fatalf("pending replies: %d, %v", len(frames), err)
			}
			// ReceiveRX found them pending and did not re-arm: do it here.
			p.RX.EnableInterrupts()
			before := p.RX.Interrupts
			exchange(t, f)
			// The signal was either waited for or is still in the eventfd.
			if p.RX.Interrupts == before && p.RX.DrainCall() == 0 {
				t.Errorf("no RX interrupt once re-enabled")
			}
		})
	}
}

// TestDPDKMemoryGrowth does what DPDK's virtio-user does when its memory
// grows: SET_MEM_TABLE again, with one more region, between
// SET_VRING_ENABLE 0 and 1, rings already running. A buffer in the new
// region must then work.
func TestDPDKMemoryGrowth(t *testing.T) {
	s := startServer(t)
	f := s.connect(t, fe.Options{Order: fe.OrderDPDK, Layout: fe.LayoutPCHole})
	p := f.Pair0()
	// Traffic before the growth (no RX buffers yet: TX only).
	if err := p.SubmitTX(eth(0x88b5, make([]byte, 46))); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitTX(3 * time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Mem.Grow(4 << 20); err != nil {
		t.Fatal(err)
	}
	if err := f.RemapMemTable(); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	gpa, err := f.Mem.AllocIn(len(f.Mem.Regions())-1, 2048, 8)
	if err != nil {
		t.Fatal(err)
	}
	head, err := p.RX.AddChain([]fe.Buffer{{GPA: gpa, Len: 2048, Write: true}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.RX.Publish(); err != nil {
		t.Fatal(err)
	}
	if err := p.SubmitTX(arpRequest()); err != nil {
		t.Fatal(err)
	}
	if err := p.RX.WaitUsedIdx(1, 3*time.Second); err != nil {
		t.Fatalf("buffer in the grown region not used: %v", err)
	}
	u := p.RX.UsedElem(0)
	if u.ID != uint32(head) || u.Len != 12+42 {
		t.Fatalf("used %+v, want head %d len 54", u, head)
	}
	b := make([]byte, 54)
	if err := f.Mem.Read(gpa, b); err != nil {
		t.Fatal(err)
	}
	checkARPReply(t, b[12:])
}

// TestFullRingInOneBatch publishes exactly ring-size chains at once on
// both rings: avail.idx is then Size ahead of the device, the legal maximum,
// which must not be mistaken for a driver running ahead.
func TestFullRingInOneBatch(t *testing.T) {
	for _, base := range []uint16{0, 65530} {
		s := startServer(t)
		f := s.connect(t, fe.Options{RingSize: 16, VringBase: base})
		p := f.Pair0()
		if err := p.PostRX(16, 2048); err != nil {
			t.Fatal(err)
		}
		var frames [][]byte
		for i := 0; i < 16; i++ {
			frames = append(frames, arpRequest())
		}
		if err := p.SubmitTX(frames...); err != nil {
			t.Fatal(err)
		}
		if p.TX.AvailIdx()-p.TX.UsedIdx() != 16 && p.TX.UsedIdx() == base {
			t.Fatalf("setup: %d chains outstanding", p.TX.AvailIdx()-p.TX.UsedIdx())
		}
		if err := p.WaitTX(3 * time.Second); err != nil {
			t.Fatal(err)
		}
		got := 0
		for got < 16 {
			fr, err := p.ReceiveRX(3 * time.Second)
			if err != nil {
				t.Fatalf("base %d: %d of 16 replies: %v", base, got, err)
			}
			for _, x := range fr {
				checkARPReply(t, x.Data)
			}
			got += len(fr)
		}
		if s.plane.broken.Load() != 0 {
			t.Fatalf("base %d: a full ring broke the queue", base)
		}
	}
}

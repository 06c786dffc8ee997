package hostile

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	fe "vunet/test/frontend"
	"vunet/vhostuser"
)

// TestDescriptorChurn makes random chains available while another goroutine
// keeps rewriting the same descriptors and indirect tables: the device sees
// tables change under it (the guest owns that memory), which must cost it a
// bad chain at most, never a crash or a hang. Heads stay inside the ring and
// avail.idx never runs more than the ring size ahead, so the queue must not
// break either.
func TestDescriptorChurn(t *testing.T) {
	isolate(t, func(t *testing.T) {
		s := startServer(t)
		s.healthy(t)
		baseFDs := fdCount(t)
		f := s.connect(t, fe.Options{RingSize: 64})
		tx := f.Pair0().TX
		mem := f.Mem
		buf, err := mem.Alloc(1<<16, 64)
		if err != nil {
			t.Fatal(err)
		}
		garbage := make([]byte, 1<<16)
		rng := rand.New(rand.NewPCG(7, 11))
		for i := range garbage {
			garbage[i] = byte(rng.Uint32())
		}
		mem.Write(buf, garbage)
		regs := mem.Regions()
		end := regs[len(regs)-1].GuestAddr + regs[len(regs)-1].Size
		randDesc := func(r *rand.Rand) fe.Desc {
			d := fe.Desc{Flags: uint16(r.IntN(8)), Next: uint16(32 + r.IntN(40))}
			switch r.IntN(6) {
			case 0:
				d.Addr = r.Uint64()
			case 1:
				d.Addr = end - uint64(r.IntN(64))
			default:
				d.Addr = buf + uint64(r.IntN(1<<16))
			}
			switch r.IntN(4) {
			case 0:
				d.Len = r.Uint32()
			default:
				d.Len = uint32(r.IntN(2048))
			}
			return d
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(1, 2))
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Descriptors 32..71 (the ring has 64: some nexts are out
				// of range) and random bytes as indirect tables.
				tx.SetDesc(uint16(32+r.IntN(32)), randDesc(r))
				off := uint64(r.IntN(1<<16 - 16))
				var b [16]byte
				for i := range b {
					b[i] = byte(r.Uint32())
				}
				mem.Write(buf+off, b[:])
			}
		}()
		r := rand.New(rand.NewPCG(3, 4))
		pushed := 0
		deadline := time.Now().Add(700 * time.Millisecond)
		for time.Now().Before(deadline) {
			// Keep at most half a ring outstanding.
			if tx.AvailIdx()-tx.UsedIdx() >= 32 {
				if err := tx.WaitUsedIdx(tx.AvailIdx()-16, 2*time.Second); err != nil {
					t.Fatalf("device stopped returning chains: avail %d used %d", tx.AvailIdx(), tx.UsedIdx())
				}
			}
			for i := 0; i < 8; i++ {
				tx.SetAvailEntry(tx.AvailIdx()+uint16(i), uint16(32+r.IntN(32)))
			}
			tx.SetAvailIdx(tx.AvailIdx() + 8)
			tx.Kick()
			pushed += 8
		}
		close(stop)
		wg.Wait()
		if err := tx.WaitUsedIdx(tx.AvailIdx(), 2*time.Second); err != nil {
			t.Fatalf("not every chain returned: avail %d used %d", tx.AvailIdx(), tx.UsedIdx())
		}
		if s.plane.broken.Load() != 0 {
			t.Fatal("queue broken by in-range heads")
		}
		st := &s.stats.Rings[1]
		t.Logf("%d chains pushed: %d bad, %d good", pushed, st.BadChains.Load(), st.Chains.Load())
		if st.BadChains.Load() == 0 {
			t.Error("no chain counted bad: the churn did not reach the device")
		}
		f.Close()
		s.healthy(t)
		waitFDs(t, baseFDs)
	})
}

// TestControlChurnUnderTraffic reconfigures a running pair (rings disabled
// and enabled, memory table re-sent) while frames flow. Each rebuild must
// carry the ring positions over: a chain lost shows as a TX chain never
// returned, a chain processed twice as a used head the driver no longer
// has outstanding (PopUsed reports it).
func TestControlChurnUnderTraffic(t *testing.T) {
	isolate(t, func(t *testing.T) {
		s := startServer(t)
		s.healthy(t)
		baseFDs := fdCount(t)
		f := s.connect(t, fe.Options{RingSize: 64, MemTable: true})
		p := f.Pair0()
		stop := make(chan struct{})
		var replies, sent atomic.Int64
		errc := make(chan error, 1)
		go func() {
			defer close(errc)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if p.RX.Outstanding() < 8 {
					if err := p.PostRX(16, 2048); err != nil && !errors.Is(err, fe.ErrRingFull) {
						errc <- err
						return
					}
				}
				if p.TX.Outstanding() < 32 {
					if err := p.SubmitTX(arpRequest(), arpRequest()); err != nil && !errors.Is(err, fe.ErrRingFull) {
						errc <- err
						return
					}
					sent.Add(2)
				}
				frames, err := p.ReceiveRX(5 * time.Millisecond)
				if err != nil && !errors.Is(err, fe.ErrTimeout) {
					errc <- err
					return
				}
				replies.Add(int64(len(frames)))
				if _, err := p.ReclaimTX(); err != nil {
					errc <- err
					return
				}
			}
		}()
		for i := 0; i < 30; i++ {
			var err error
			switch i % 3 {
			case 0:
				err = f.RemapMemTable()
			case 1:
				err = f.SetVringEnable(0, false)
				if err == nil {
					time.Sleep(2 * time.Millisecond)
					err = f.SetVringEnable(0, true)
				}
			case 2:
				err = f.SetVringEnable(1, false)
				if err == nil {
					err = f.SetVringEnable(1, true)
				}
			}
			if err != nil {
				t.Fatalf("churn step %d: %v", i, err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * time.Millisecond)
		}
		close(stop)
		if err := <-errc; err != nil {
			t.Fatalf("traffic: %v", err)
		}
		if err := p.WaitTX(3 * time.Second); err != nil {
			t.Fatalf("TX chains lost across rebuilds: %v", err)
		}
		t.Logf("%d frames sent, %d replies during the churn", sent.Load(), replies.Load())
		if replies.Load() == 0 {
			t.Error("no traffic got through during the churn")
		}
		if n := s.stats.Rings[0].BadChains.Load() + s.stats.Rings[1].BadChains.Load(); n != 0 {
			t.Errorf("%d good chains counted bad across rebuilds", n)
		}
		exchangeSkipping(t, f)
		f.Close()
		s.healthy(t)
		waitFDs(t, baseFDs)
	})
}

// TestFrontendVanishesMidTraffic closes the socket while frames flow and
// RX buffers are outstanding: the server must clean up and serve the next
// front-end.
func TestFrontendVanishesMidTraffic(t *testing.T) {
	isolate(t, func(t *testing.T) {
		s := startServer(t)
		s.healthy(t)
		baseFDs := fdCount(t)
		f := s.connect(t, fe.Options{})
		p := f.Pair0()
		if err := p.PostRX(64, 2048); err != nil {
			t.Fatal(err)
		}
		var frames [][]byte
		for i := 0; i < 100; i++ {
			frames = append(frames, arpRequest())
		}
		if err := p.SubmitTX(frames...); err != nil {
			t.Fatal(err)
		}
		f.Conn.Close()
		time.Sleep(5 * time.Millisecond)
		f.Close()
		s.healthy(t)
		waitFDs(t, baseFDs)
	})
}

// TestSecondFrontendTurnedAway connects a second front-end while one is
// active: it is closed, counted, and the first one keeps working.
func TestSecondFrontendTurnedAway(t *testing.T) {
	s := startServer(t)
	f := s.connect(t, fe.Options{})
	exchange(t, f)
	g, err := fe.Dial(s.path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.Conn.Timeout = 2 * time.Second
	if _, err := g.GetFeatures(); err == nil || !isClosed(err) {
		t.Fatalf("second front-end got %v, want the connection closed", err)
	}
	exchange(t, f)
	if s.stats.Errors[vhostuser.ErrReasonRejected].Load() == 0 {
		t.Error("rejected front-end not counted")
	}
}

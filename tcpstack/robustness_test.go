package tcpstack

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// corruptChain points chain head's first descriptor outside guest memory, so
// virtqueue refuses it as a bad chain when it is popped.
func (r *testRing) corruptChain(head uint16) {
	binary.LittleEndian.PutUint64(r.DescTable()[16*int(head):], 1<<40)
}

// TestRXBadChainAmongReservations: a bad chain behind a reserved one makes
// the reserved one unrewindable; it must be returned empty (not leaked), the
// later ones rewound, and the waiting reply delivered after a refill.
func TestRXBadChainAmongReservations(t *testing.T) {
	p := newTestPair(t, featMrg, 64)
	p.rx.AddBuffers(nil, 16)
	bad := p.rx.AddBuffers(nil, 16)
	p.rx.corruptChain(bad)
	p.rx.AddBuffers(nil, 16)
	p.rx.Post()
	p.start()
	p.addTX(arpRequest(testGuestIP, testGwIP)) // the reply needs 4 chains of 16 bytes
	p.tx.Send()
	st := p.stats()
	waitFor(t, "reply waits", 2*time.Second, func() bool { return st.RXWaitedForDescriptors.Load() == 1 })
	waitFor(t, "unrewindable chain returned", 2*time.Second, func() bool { return st.RXChainsWasted.Load() == 1 })
	waitFor(t, "bad and wasted chains used", 2*time.Second, func() bool { return p.rx.UsedIdx() == 2 })
	for i := 0; i < 2; i++ {
		if _, n, ok := p.rx.popUsed(); !ok || n != 0 {
			t.Fatalf("used %d: ok %v len %d, want an empty buffer", i, ok, n)
		}
	}
	for i := 0; i < 3; i++ {
		p.rx.AddBuffers(nil, 16)
	}
	p.rx.Send()
	waitFor(t, "reply", 2*time.Second, func() bool { return p.rx.UsedIdx() == 6 })
	p.s.StopPair(0)
	hdrs, frames := p.rxRead(t)
	if len(frames) != 1 || hdrs[0].NumBuffers != 4 || !bytes.Equal(frames[0], arpReplyFor(testGuestIP, testGwIP)) {
		t.Fatalf("hdrs %+v frames %x", hdrs, frames)
	}
	if got := p.rx.Q.LastAvail(); got != 6 {
		t.Errorf("RX LastAvail %d, want 6", got)
	}
}

// TestPollingWithoutKickFDs: a front-end that gives no kick eventfds is
// served by polling the rings.
func TestPollingWithoutKickFDs(t *testing.T) {
	p := newTestPair(t, featModern, 64)
	p.rx.noKick, p.tx.noKick = true, true
	p.rx.rebuild(0, 0)
	p.tx.rebuild(1, 0)
	p.start()
	p.addTX(arpRequest(testGuestIP, testGwIP))
	p.tx.Post() // no kick: there is no fd
	time.Sleep(20 * time.Millisecond)
	p.rx.AddBuffers(nil, 2048)
	p.rx.Post()
	waitFor(t, "reply by polling", 2*time.Second, func() bool { return p.rx.UsedIdx() == 1 })
	if p.tx.UsedIdx() != 1 {
		t.Errorf("TX used %d", p.tx.UsedIdx())
	}
}

// TestStopPairUnderLoad stops and restarts a pair while the guest keeps
// sending; every TX chain must come back exactly once.
func TestStopPairUnderLoad(t *testing.T) {
	p := newTestPair(t, featModern, 256)
	p.start()
	stop := make(chan struct{})
	done := make(chan int)
	frame := otherFrame(0x88b5, 60)
	go func() {
		sent := 0
		for {
			select {
			case <-stop:
				done <- sent
				return
			default:
			}
			for {
				if _, _, ok := p.tx.popUsed(); !ok {
					break
				}
			}
			if p.tx.Free() > 0 && sent-int(p.tx.LastUsed()) < 200 {
				p.addTX(frame)
				p.tx.Send()
				sent++
			} else {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	for i := 0; i < 20; i++ {
		time.Sleep(2 * time.Millisecond)
		p.s.StopPair(0)
		p.rx.rebuild(0, p.rx.Q.LastAvail())
		p.tx.rebuild(1, p.tx.Q.LastAvail())
		p.qp.RX, p.qp.TX = p.rx.Q, p.tx.Q
		if err := p.s.StartPair(p.qp); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	sent := <-done
	waitFor(t, "all TX used", 3*time.Second, func() bool { return int(p.tx.UsedIdx()) == sent%65536 })
	if got := p.stats().TX.Frames.Load(); got != uint64(sent) {
		t.Errorf("TX frames %d, sent %d", got, sent)
	}
}

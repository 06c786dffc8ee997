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
	d := r.m.buf[r.desc+16*uint64(head):]
	binary.LittleEndian.PutUint64(d[0:], 1<<40)
}

// TestRXBadChainAmongReservations: a bad chain behind a reserved one makes
// the reserved one unrewindable; it must be returned empty (not leaked), the
// later ones rewound, and the waiting reply delivered after a refill.
func TestRXBadChainAmongReservations(t *testing.T) {
	p := newTestPair(t, featMrg, 64)
	p.rx.addChain(nil, []uint32{16})
	bad := p.rx.addChain(nil, []uint32{16})
	p.rx.corruptChain(bad)
	p.rx.addChain(nil, []uint32{16})
	p.rx.publish()
	p.start()
	p.addTX(arpRequest(testGuestIP, testGwIP)) // the reply needs 4 chains of 16 bytes
	p.tx.send()
	st := p.stats()
	waitFor(t, "reply waits", 2*time.Second, func() bool { return st.RXWaitedForDescriptors.Load() == 1 })
	waitFor(t, "unrewindable chain returned", 2*time.Second, func() bool { return st.RXChainsWasted.Load() == 1 })
	waitFor(t, "bad and wasted chains used", 2*time.Second, func() bool { return p.rx.usedIdx() == 2 })
	for i := 0; i < 2; i++ {
		if _, n, ok := p.rx.popUsed(); !ok || n != 0 {
			t.Fatalf("used %d: ok %v len %d, want an empty buffer", i, ok, n)
		}
	}
	for i := 0; i < 3; i++ {
		p.rx.addChain(nil, []uint32{16})
	}
	p.rx.send()
	waitFor(t, "reply", 2*time.Second, func() bool { return p.rx.usedIdx() == 6 })
	p.s.StopPair(0)
	hdrs, frames := p.rxRead(t)
	if len(frames) != 1 || hdrs[0].NumBuffers != 4 || !bytes.Equal(frames[0], arpReplyFor(testGuestIP, testGwIP)) {
		t.Fatalf("hdrs %+v frames %x", hdrs, frames)
	}
	if got := p.rx.q.LastAvail(); got != 6 {
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
	p.tx.publish() // no kick: there is no fd
	time.Sleep(20 * time.Millisecond)
	p.rx.addChain(nil, []uint32{2048})
	p.rx.publish()
	waitFor(t, "reply by polling", 2*time.Second, func() bool { return p.rx.usedIdx() == 1 })
	if p.tx.usedIdx() != 1 {
		t.Errorf("TX used %d", p.tx.usedIdx())
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
			if len(p.tx.freeDesc) > 0 && sent-int(p.tx.lastUsed) < 200 {
				p.addTX(frame)
				p.tx.send()
				sent++
			} else {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	for i := 0; i < 20; i++ {
		time.Sleep(2 * time.Millisecond)
		p.s.StopPair(0)
		p.rx.rebuild(0, p.rx.q.LastAvail())
		p.tx.rebuild(1, p.tx.q.LastAvail())
		p.qp.RX, p.qp.TX = p.rx.q, p.tx.q
		if err := p.s.StartPair(p.qp); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	sent := <-done
	waitFor(t, "all TX used", 3*time.Second, func() bool { return int(p.tx.usedIdx()) == sent%65536 })
	if got := p.stats().TX.Frames.Load(); got != uint64(sent) {
		t.Errorf("TX frames %d, sent %d", got, sent)
	}
}

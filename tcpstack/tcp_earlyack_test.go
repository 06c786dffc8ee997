package tcpstack

import (
	"io"
	"net"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/test/testenv"
)

// TestTCPAcksEachFullTXBatch: a guest that fills the TX ring with data
// (a sender held only by the window we give, testpmd's guest) must see an
// ACK for each full batch the loop takes, not one for the whole ring at
// the end of the iteration: otherwise it sits idle, its window used up,
// while the loop works through the ring, and refills only after.
func TestTCPAcksEachFullTXBatch(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		testenv.Unavailable(t, err, "a loopback interface with 127.0.0.1")
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	// Three full batches of data.
	const segs, size = 3 * txBatchMax, 50
	got := make(chan int, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// All of it, before the Stack's Close resets the connection (a
		// reset discards what the peer has not read yet).
		n, _ := io.ReadFull(c, make([]byte, segs*size))
		got <- n
	}()

	p := newFlowPair(t, featMrg, nil)
	p.postRX(64, 2048)
	p.start()
	const gseq = 5000
	p.addTX(tcpGuestFrame(testGuest4, testGw4, 45001, port, gseq, 0, header.TCPFlagSYN, nil))
	p.tx.Send()
	var synAck header.TCP
	for deadline := time.Now().Add(3 * time.Second); synAck == nil && time.Now().Before(deadline); {
		_, frames := p.rxReadIP(t)
		for _, f := range frames {
			if s := guestTCP(t, f, testGw4, testGuest4); s != nil && s.Flags().Has(header.TCPFlagSYN|header.TCPFlagACK) {
				synAck = s
			}
		}
		time.Sleep(time.Millisecond)
	}
	if synAck == nil {
		t.Fatal("no SYN-ACK")
	}
	hseq := synAck.SequenceNumber() + 1
	p.addTX(tcpGuestFrame(testGuest4, testGw4, 45001, port, gseq+1, hseq, header.TCPFlagACK, nil))
	p.tx.Send()

	// The batches, published at once: one kick, one loop iteration takes
	// them all.
	seq := uint32(gseq + 1)
	for i := 0; i < segs; i++ {
		p.addTX(tcpGuestFrame(testGuest4, testGw4, 45001, port, seq, hseq, header.TCPFlagACK, make([]byte, size)))
		seq += size
	}
	p.tx.Send()

	acks := map[uint32]bool{}
	for deadline := time.Now().Add(3 * time.Second); !acks[seq] && time.Now().Before(deadline); {
		_, frames := p.rxReadIP(t)
		for _, f := range frames {
			if s := guestTCP(t, f, testGw4, testGuest4); s != nil && s.Flags().Has(header.TCPFlagACK) {
				acks[s.AckNumber()] = true
			}
		}
		for p.rx.Free() > 0 && p.rx.Q != nil {
			p.rx.AddBuffers(nil, 2048)
		}
		p.rx.Send()
		time.Sleep(time.Millisecond)
	}
	if !acks[seq] {
		t.Fatalf("no ACK for all %d bytes; ACKs seen: %v", segs*size, acks)
	}
	// One ACK per full batch on the way (where the batches fall depends on
	// whether the handshake's last ACK rode in the first one).
	partial := 0
	for a := range acks {
		if seqAfter(a, gseq+1) && seqAfter(seq, a) {
			partial++
		}
	}
	if partial < segs/txBatchMax-1 {
		t.Errorf("%d ACKs before the last byte, want %d (one per full batch): ACKs seen %v", partial, segs/txBatchMax-1, acks)
	}
	select {
	case n := <-got:
		if n != segs*size {
			t.Errorf("host peer read %d bytes, want %d", n, segs*size)
		}
	case <-time.After(3 * time.Second):
		t.Error("host peer did not get all the data")
	}
	p.s.Close()
}

func seqAfter(a, b uint32) bool { return int32(a-b) > 0 }

package tcp

import (
	"bytes"
	"io"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
)

// TestTCPSendGather: the in-order segments of one connection in a TX batch
// reach the socket in one write, in order, and whatever else comes for the
// connection writes the run first.
func TestTCPSendGather(t *testing.T) {
	data := guestframe.Pattern(4000)
	seg := func(i int) []byte { return data[i*1000 : (i+1)*1000] }
	for _, tc := range []struct {
		name       string
		run        func(h *tcpHarness)
		writes     uint64 // runs written
		wantEOF    bool
		wantAckAll bool
	}{
		{"four segments: one write", func(h *tcpHarness) {
			for i := range 4 {
				h.sendAck(seg(i))
			}
		}, 1, false, true},
		{"a FIN writes the run first", func(h *tcpHarness) {
			for i := range 4 {
				h.sendAck(seg(i))
			}
			h.sendFin()
		}, 1, true, true},
		{"a pure ACK writes the run first", func(h *tcpHarness) {
			h.sendAck(seg(0))
			h.sendAck(seg(1))
			h.sendAck(nil)
			h.sendAck(seg(2))
			h.sendAck(seg(3))
		}, 2, false, true},
		{"a segment again writes the run first", func(h *tcpHarness) {
			h.sendAck(seg(0))
			h.sendAck(seg(1))
			h.seq -= 1000
			h.sendAck(seg(1)) // the guest sends it again
			h.sendAck(seg(2))
			h.sendAck(seg(3))
		}, 2, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tcpNewHarness(t, Config{})
			peer := h.establish(h.listen(), tcpMss1400ws7)
			h.flush()
			h.batch = true
			base := h.tab.gatherWrites
			tc.run(h)
			h.flushSends()
			h.batch = false
			if w := h.tab.gatherWrites - base; w != tc.writes {
				t.Errorf("%d runs written, want %d", w, tc.writes)
			}
			if got := tcpReadN(t, peer, len(data)); !bytes.Equal(got, data) {
				t.Fatal("the peer got other bytes")
			}
			if tc.wantEOF {
				peer.SetReadDeadline(time.Now().Add(5 * time.Second))
				if n, err := peer.Read(make([]byte, 1)); n != 0 || err != io.EOF {
					t.Fatalf("after the data: %d bytes, %v; want EOF", n, err)
				}
			}
			ss := h.flush()
			if tc.wantAckAll && (len(ss) == 0 || ss[len(ss)-1].ack != h.seq || ss[len(ss)-1].flags&header.TCPFlagACK == 0) {
				t.Fatalf("got %s, want an ACK of everything (%d)", segsString(ss), h.seq)
			}
		})
	}
}

// TestTCPSendGatherFullSocket: a run the socket takes only part of keeps
// its rest for a SACK guest, which then has it all acknowledged or
// SACKed, and the rest goes at EPOLLOUT: the host gets the stream whole
// with nothing sent again.
func TestTCPSendGatherFullSocket(t *testing.T) {
	h := tcpNewHarness(t, Config{SndBuf: 4096})
	ln := h.listen()
	h.setRcvBuf(ln, 4096)
	peer := h.establish(ln, tcpSackOpts)
	h.flush()
	base := h.seq
	const size, n = 1000, 60
	data := guestframe.Pattern(n * size)
	h.batch = true
	for i := range n {
		h.sendAck(data[i*size : (i+1)*size])
	}
	h.flushSends()
	h.batch = false
	f := h.flow()
	if f.ooo == nil || f.ooo.n == 0 || f.ooo.ranges[0].start != f.seqFromGuest || f.ooo.ranges[0].end != base+n*size {
		t.Fatalf("after the run: %d bytes written, kept %v; want a full socket and the rest kept from there", f.seqFromGuest-base, f.ooo)
	}
	if dups := countAcksOf(h.flush(), f.seqFromGuest); dups < 3 {
		t.Errorf("%d ACKs of the first byte refused, want the ACK and duplicates (3)", dups)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(data))))
		got <- b
	}()
	h.collect("everything written", func([]tcpSeg) bool { return f.seqFromGuest == base+uint32(len(data)) })
	select {
	case b := <-got:
		if !bytes.Equal(b, data) {
			t.Fatalf("host got %d bytes, not the stream in order", len(b))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("host did not get the stream")
	}
}

// TestTCPSendGatherFullSocketNoSACK: a guest without SACK gets duplicate
// ACKs for a run the socket took only part of, as it did for the
// segments after a short write, and sends the rest again.
func TestTCPSendGatherFullSocketNoSACK(t *testing.T) {
	h := tcpNewHarness(t, Config{SndBuf: 4096})
	ln := h.listen()
	h.setRcvBuf(ln, 4096)
	h.establish(ln, tcpMss1400ws7)
	h.flush()
	const size, n = 1000, 60
	data := guestframe.Pattern(n * size)
	h.batch = true
	for i := range n {
		h.sendAck(data[i*size : (i+1)*size])
	}
	h.flushSends()
	h.batch = false
	f := h.flow()
	if f.ooo != nil || f.seqFromGuest == h.seq {
		t.Fatalf("%d of %d bytes written, kept %v; want a full socket and nothing kept", f.seqFromGuest-(h.seq-n*size), n*size, f.ooo)
	}
	if dups := countAcksOf(h.flush(), f.seqFromGuest); dups < 3 {
		t.Errorf("%d ACKs of the first byte refused, want the ACK and duplicates (3)", dups)
	}
}

// countAcksOf counts the pure ACKs of ack among ss.
func countAcksOf(ss []tcpSeg, ack uint32) int {
	n := 0
	for _, s := range ss {
		if s.flags == header.TCPFlagACK && len(s.payload) == 0 && s.ack == ack {
			n++
		}
	}
	return n
}

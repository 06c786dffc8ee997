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
		name    string
		run     func(h *tcpHarness)
		writes  uint64 // runs written
		wantEOF bool
	}{
		{"four segments: one write", func(h *tcpHarness) {
			for i := range 4 {
				h.sendAck(seg(i))
			}
		}, 1, false},
		{"a FIN writes the run first", func(h *tcpHarness) {
			for i := range 4 {
				h.sendAck(seg(i))
			}
			h.sendFin()
		}, 1, true},
		{"a pure ACK writes the run first", func(h *tcpHarness) {
			h.sendAck(seg(0))
			h.sendAck(seg(1))
			h.sendAck(nil)
			h.sendAck(seg(2))
			h.sendAck(seg(3))
		}, 2, false},
		{"a segment again writes the run first", func(h *tcpHarness) {
			h.sendAck(seg(0))
			h.sendAck(seg(1))
			h.seq -= 1000
			h.sendAck(seg(1)) // the guest sends it again
			h.sendAck(seg(2))
			h.sendAck(seg(3))
		}, 2, false},
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
			if len(ss) == 0 || ss[len(ss)-1].ack != h.seq || ss[len(ss)-1].flags&header.TCPFlagACK == 0 {
				t.Fatalf("got %s, want an ACK of everything (%d)", segsString(ss), h.seq)
			}
		})
	}
}

// TestTCPSendGatherFullSocket: a run the socket takes only part of (60
// segments into a 4 KiB socket) is handled as the segments after a short
// write were: every guest gets duplicate ACKs of the first byte refused;
// a SACK guest's rest is kept and goes at EPOLLOUT, so the host gets the
// stream whole with nothing sent again; a guest without SACK sends it
// again.
func TestTCPSendGatherFullSocket(t *testing.T) {
	for _, sack := range []bool{true, false} {
		t.Run(map[bool]string{true: "SACK", false: "no SACK"}[sack], func(t *testing.T) {
			h := tcpNewHarness(t, Config{SndBuf: 4096})
			ln := h.listen()
			h.setRcvBuf(ln, 4096)
			opts := tcpMss1400ws7
			opts.SACKPermitted = sack
			peer := h.establish(ln, opts)
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
			written := f.seqFromGuest - base
			if written == 0 || written == n*size {
				t.Fatalf("%d of %d bytes written; want a full socket (SO_SNDBUF 4096, the peer's SO_RCVBUF 4096)", written, n*size)
			}
			kept := f.ooo != nil && f.ooo.n == 1 && f.ooo.ranges[0].start == f.seqFromGuest && f.ooo.ranges[0].end == base+n*size
			if kept != sack {
				t.Fatalf("after the run: %d bytes written, kept %v; want the rest kept: %v", written, f.ooo, sack)
			}
			if dups := countAcksOf(h.flush(), f.seqFromGuest); dups < 3 {
				t.Errorf("%d ACKs of the first byte refused, want the ACK and duplicates (3)", dups)
			}
			if sack {
				h.expectStream(peer, data, func() bool { return f.seqFromGuest == base+uint32(len(data)) })
			}
		})
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

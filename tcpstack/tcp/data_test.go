package tcp

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
)

// waitQueued waits until the host socket of the harness flow has n bytes
// queued for reading (SIOCINQ), so tests do not race the loopback.
func (h *tcpHarness) waitQueued(n int) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := unix.IoctlGetInt(h.flow().fd, unix.SIOCINQ)
		if err == nil && v >= n {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("socket has %d bytes queued, want %d", v, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (h *tcpHarness) queued() int {
	v, err := unix.IoctlGetInt(h.flow().fd, unix.SIOCINQ)
	if err != nil {
		h.t.Fatal(err)
	}
	return v
}

// TestTCPFrameAccounting: with k of n needed descriptors free, seqToGuest
// advances by exactly the bytes of k frames; the rest goes out on the next
// output pass once descriptors are back, with no timer and no socket event.
func TestTCPFrameAccounting(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	f := h.flow()
	start := f.seqToGuest

	data := guestframe.Pattern(10 * 1400)
	peer.Write(data)
	h.waitQueued(len(data))
	h.w.free = 3
	got := h.pump(0)
	if len(got) != 3 {
		t.Fatalf("want 3 frames, got %d", len(got))
	}
	if !h.blocked {
		t.Fatalf("Flush did not report the ring as exhausted")
	}
	if f.seqToGuest-start != 3*1400 {
		t.Fatalf("seqToGuest advanced %d, want %d", f.seqToGuest-start, 3*1400)
	}
	for i, s := range got {
		if s.seq != start+uint32(i*1400) || len(s.payload) != 1400 {
			t.Fatalf("frame %d: seq %d len %d", i, s.seq-start, len(s.payload))
		}
	}
	if h.w.free != 0 || len(h.w.pending) != 0 {
		t.Fatalf("reservations leaked: free %d pending %d", h.w.free, len(h.w.pending))
	}
	// Nothing happens without descriptors, however often we are called.
	if again := h.flush(); len(again) != 0 || f.seqToGuest-start != 3*1400 {
		t.Fatalf("sent without descriptors: %d frames", len(again))
	}
	// Descriptors return: the loop calls Flush, the rest goes out at once.
	h.w.free = 100
	rest := h.flush()
	if len(rest) != 7 || h.blocked {
		t.Fatalf("want the 7 remaining frames, got %d (blocked %v)", len(rest), h.blocked)
	}
	if !bytes.Equal(append(tcpPayloadOf(got), tcpPayloadOf(rest)...), data) {
		t.Fatalf("payload mismatch")
	}
	if f.seqToGuest-start != uint32(len(data)) {
		t.Fatalf("seqToGuest advanced %d, want %d", f.seqToGuest-start, len(data))
	}
	if h.stats.BytesToGuest.Load() != uint64(len(data)) {
		t.Fatalf("BytesToGuest %d", h.stats.BytesToGuest.Load())
	}
}

// TestTCPFlagsDoNotOvertakeData: a FIN from the host peer, and an ACK for
// guest data, queue behind data that is waiting for descriptors.
func TestTCPFlagsDoNotOvertakeData(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	f := h.flow()
	start := f.seqToGuest

	data := guestframe.Pattern(3 * 1400)
	peer.Write(data)
	peer.CloseWrite()
	h.waitQueued(len(data))
	time.Sleep(20 * time.Millisecond) // let the FIN arrive too
	h.w.free = 2
	first := h.pump(0)
	// Guest data arrives while the ring is still empty: its ACK must wait.
	h.sendAck([]byte("hello"))
	first = append(first, h.flush()...)
	if len(first) != 2 {
		t.Fatalf("want 2 frames, got %d", len(first))
	}
	for _, s := range first {
		if s.flags.Has(header.TCPFlagFIN) || len(s.payload) == 0 {
			t.Fatalf("flag frame overtook data: %+v", s)
		}
	}
	h.w.free = 10
	rest := h.flush()
	if len(rest) < 2 {
		t.Fatalf("want data then FIN, got %d frames", len(rest))
	}
	if len(rest[0].payload) != 1400 || rest[0].seq != start+2800 {
		t.Fatalf("third data frame wrong: seq %d len %d", rest[0].seq-start, len(rest[0].payload))
	}
	fin := rest[1]
	if !fin.flags.Has(header.TCPFlagFIN) || fin.seq != start+4200 || len(fin.payload) != 0 {
		t.Fatalf("FIN wrong: %+v", fin)
	}
	// The FIN (or a frame before it) carries the ACK for the guest's data.
	if fin.ack != h.seq {
		t.Fatalf("ACK for guest data = %d, want %d", fin.ack, h.seq)
	}
	if b := tcpReadN(t, peer, 5); string(b) != "hello" {
		t.Fatalf("peer got %q", b)
	}
}

// tcpTestPeek drives MSG_PEEK reads, MSG_TRUNC consumption on guest ACKs and
// rewinds on duplicate ACKs, with or without SO_PEEK_OFF.
func tcpTestPeek(t *testing.T, noPeekOff bool) {
	if !noPeekOff && !hostsock.PeekOffsetSupported(false) {
		// Not a missing package but the kernel's age (before 6.10): that
		// kernel runs the fallback, which TestTCPPeekDiscardFallback tests.
		t.Skip("kernel without SO_PEEK_OFF for TCP")
	}
	h := tcpNewHarness(t, Config{MTU: 1500, NoPeekOffset: noPeekOff})
	if h.tab.peekOff[0] == noPeekOff {
		t.Fatalf("peekOff = %v", h.tab.peekOff)
	}
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	f := h.flow()
	if f.peekOff == noPeekOff {
		t.Fatalf("connection peekOff = %v", f.peekOff)
	}
	start := f.seqToGuest

	a, b := guestframe.Pattern(1000), bytes.Repeat([]byte("B"), 700)
	peer.Write(a)
	h.waitQueued(len(a))
	ga := h.pump(0)
	if !bytes.Equal(tcpPayloadOf(ga), a) {
		t.Fatalf("first read wrong")
	}
	peer.Write(b)
	h.waitQueued(len(a) + len(b))
	gb := h.collect("second chunk", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(b) })
	if !bytes.Equal(tcpPayloadOf(gb), b) || gb[0].seq != start+1000 {
		t.Fatalf("second read resent old data or wrong seq: seq %d len %d", gb[0].seq-start, len(tcpPayloadOf(gb)))
	}
	// Unacknowledged data stays in the kernel.
	if q := h.queued(); q != 1700 {
		t.Fatalf("socket holds %d bytes, want 1700", q)
	}
	// Guest ACKs the first chunk: it is dropped from the socket.
	h.ack = start + 1000
	h.sendAck(nil)
	if q := h.queued(); q != 700 {
		t.Fatalf("after ACK socket holds %d bytes, want 700", q)
	}
	if f.seqAckFromGuest != start+1000 {
		t.Fatalf("seqAckFromGuest %d", f.seqAckFromGuest-start)
	}
	h.flush()
	// Two duplicate ACKs: the guest wants everything after 1000 again.
	h.sendAck(nil)
	h.sendAck(nil)
	re := h.flush()
	if len(re) == 0 || re[0].seq != start+1000 || !bytes.Equal(tcpPayloadOf(re), b) {
		t.Fatalf("retransmission wrong: %+v", re)
	}
	if h.stats.Retransmits[stats.TCPRetransDupAck].Load() != 1 {
		t.Fatalf("dup-ack retransmits %d", h.stats.Retransmits[stats.TCPRetransDupAck].Load())
	}
	// And reading goes on after the rewound data, not before it.
	c := bytes.Repeat([]byte("C"), 300)
	peer.Write(c)
	h.waitQueued(1000)
	gc := h.collect("third chunk", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(c) })
	if gc[0].seq != start+1700 || !bytes.Equal(tcpPayloadOf(gc), c) {
		t.Fatalf("after rewind: seq %d data %q", gc[0].seq-start, tcpPayloadOf(gc)[:10])
	}
	// Everything acknowledged: the socket is empty.
	h.ack = start + 2000
	h.sendAck(nil)
	if q := h.queued(); q != 0 {
		t.Fatalf("socket holds %d bytes after full ACK", q)
	}
}

func TestTCPPeekOffset(t *testing.T)          { tcpTestPeek(t, false) }
func TestTCPPeekDiscardFallback(t *testing.T) { tcpTestPeek(t, true) }

// TestTCPGuestDataToHost: guest payload reaches the host socket and is
// acknowledged for what was written (loopback peer: at once).
func TestTCPGuestDataToHost(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	h.flush()
	data := guestframe.Pattern(5000)
	h.sendAck(data[:3000])
	h.sendAck(data[3000:])
	got := h.flush()
	if len(got) == 0 || got[len(got)-1].ack != h.seq {
		t.Fatalf("no ACK for written data: %+v", got)
	}
	if b := tcpReadN(t, peer, len(data)); !bytes.Equal(b, data) {
		t.Fatalf("peer got wrong data")
	}
	// A retransmission of old data is not written twice, only ACKed.
	h.inject(h.frame(header.TCPFlagACK, h.seq-3000, h.ack, h.wnd, nil, data[2000:]))
	if again := h.flush(); len(again) != 1 || again[0].ack != h.seq {
		t.Fatalf("old data not re-ACKed: %+v", again)
	}
	// A segment after a gap is dropped and the expected sequence re-ACKed,
	// with duplicate ACKs for the guest's fast retransmit, once per gap.
	h.inject(h.frame(header.TCPFlagACK, h.seq+100, h.ack, h.wnd, nil, []byte("gap")))
	again := h.flush()
	if len(again) != 1+dupAcksToSend {
		t.Fatalf("gap: want %d ACKs, got %d", 1+dupAcksToSend, len(again))
	}
	for _, s := range again {
		if s.ack != h.seq || s.flags != header.TCPFlagACK || s.wnd != again[0].wnd || len(s.payload) != 0 {
			t.Fatalf("gap: not a duplicate ACK: %+v", s)
		}
	}
	h.inject(h.frame(header.TCPFlagACK, h.seq+200, h.ack, h.wnd, nil, []byte("gap")))
	if again := h.flush(); len(again) != 1 {
		t.Fatalf("same gap: want one ACK, got %d", len(again))
	}
	if h.stats.BytesFromGuest.Load() != uint64(len(data)) {
		t.Fatalf("BytesFromGuest = %d", h.stats.BytesFromGuest.Load())
	}
	peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, _ := peer.Read(make([]byte, 10)); n != 0 {
		t.Fatalf("peer got %d extra bytes", n)
	}
}

// TestTCPFallbackChunkedBuffers: the discard-buffer fallback with data in
// flight and guest buffers split at odd sizes still places every byte in
// order, with correct checksums.
func TestTCPFallbackChunkedBuffers(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500, NoPeekOffset: true})
	h.w.chunk = 333
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	data := guestframe.Pattern(50000)
	var got []byte
	for off := 0; off < len(data); off += 12345 {
		end := min(off+12345, len(data))
		peer.Write(data[off:end])
		segs := h.collect("chunk", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= end-off })
		got = append(got, tcpPayloadOf(segs)...)
		// ACK only half of what arrived: the next read skips the rest.
		l := segs[len(segs)/2]
		h.ack = l.seq
		h.sendAck(nil)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("data corrupted")
	}
}

// TestTCPTinyBuffersFinAfterAllData: guest RX buffers split into 12-byte
// iovecs make one pass want more iovecs than one recvmsg takes. With the
// peer's FIN already seen, the short peek that follows must not be taken
// for the end of the data: the guest gets every byte, then the FIN.
func TestTCPTinyBuffersFinAfterAllData(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	h.w.chunk = 12
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	data := guestframe.Pattern(100000)
	if _, err := peer.Write(data); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	time.Sleep(50 * time.Millisecond) // data and FIN queued before the first pass
	var got []byte
	fin := false
	deadline := time.Now().Add(5 * time.Second)
	for !fin {
		if time.Now().After(deadline) {
			t.Fatalf("no FIN; got %d of %d bytes", len(got), len(data))
		}
		for _, s := range h.pump(10 * time.Millisecond) {
			if fin && len(s.payload) > 0 {
				t.Fatalf("data after FIN")
			}
			got = append(got, s.payload...)
			if s.flags.Has(header.TCPFlagFIN) {
				fin = true
			}
			h.ack = s.seq + uint32(len(s.payload))
		}
		h.sendAck(nil)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("guest got %d bytes before FIN, want %d (equal %v)", len(got), len(data), bytes.Equal(got, data[:min(len(got), len(data))]))
	}
}

// TestTCPRxRefillThenNewHostData: a pass runs out of RX buffers exactly at
// a frame boundary (all socket data placed). After the refill everything
// readable is in flight, and data the host sends next must still reach
// the guest without waiting for a guest ACK.
func TestTCPRxRefillThenNewHostData(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	h.flush()
	first := guestframe.Pattern(2 * 1400)
	peer.Write(first)
	h.waitQueued(len(first))
	h.w.free = 2
	got := h.pump(100 * time.Millisecond)
	if !bytes.Equal(tcpPayloadOf(got), first) || !h.blocked {
		t.Fatalf("want both frames and a blocked pass, got %d bytes, blocked %v", len(tcpPayloadOf(got)), h.blocked)
	}
	h.w.free = 100
	if got := h.flush(); len(tcpPayloadOf(got)) != 0 {
		t.Fatalf("data sent twice")
	}
	second := []byte("more from the host")
	peer.Write(second)
	more := h.collect("new host data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(second) })
	if string(tcpPayloadOf(more)) != string(second) {
		t.Fatalf("guest got %q", tcpPayloadOf(more))
	}
}

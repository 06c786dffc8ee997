package tcp

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
)

var tcpSackOpts = header.TCPOptions{HasMSS: true, MSS: 1400, HasWindowScale: true, WindowScale: 7, SACKPermitted: true}

// sackBlocksOf returns the SACK blocks of the last ACK among ss, and that
// ACK.
func sackBlocksOf(ss []tcpSeg) (blocks []header.TCPSACKBlock, ack uint32) {
	for _, s := range ss {
		if s.flags.Has(header.TCPFlagACK) {
			blocks, ack = s.opts.SACKBlocks[:s.opts.NumSACKBlocks], s.ack
		}
	}
	return blocks, ack
}

// TestTCPSACKNegotiated: our SYN-ACK accepts SACK when the guest's SYN
// offers it, and only then.
func TestTCPSACKNegotiated(t *testing.T) {
	for _, offer := range []bool{true, false} {
		h := tcpNewHarness(t, Config{})
		h.listen()
		o := tcpMss1400ws7
		o.SACKPermitted = offer
		h.sendSYN(o)
		ss := h.collect("SYN-ACK", func(ss []tcpSeg) bool { return len(ss) > 0 })
		if ss[0].flags != header.TCPFlagSYN|header.TCPFlagACK || ss[0].opts.SACKPermitted != offer {
			t.Errorf("guest offers SACK %v: SYN-ACK %v, SACK-permitted %v", offer, ss[0].flags, ss[0].opts.SACKPermitted)
		}
	}
	h := tcpNewHarness(t, Config{NoSACK: true})
	h.listen()
	h.sendSYN(tcpSackOpts)
	if ss := h.collect("SYN-ACK", func(ss []tcpSeg) bool { return len(ss) > 0 }); ss[0].opts.SACKPermitted {
		t.Error("SACK accepted with NoSACK")
	}
}

// TestTCPOutOfOrderKeptAndSACKed: segments past a lost one are kept, each
// ACK says which with SACK blocks (the latest first), nothing of them
// reaches the host before the hole is filled, and once it is, everything
// does, in order, with one cumulative ACK and no SACK left.
func TestTCPOutOfOrderKeptAndSACKed(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpSackOpts)
	seg := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 1000) }
	base := h.seq
	at := func(i int) uint32 { return base + uint32(1000*i) }
	send := func(i int) {
		h.inject(h.frame(header.TCPFlagACK, at(i), h.ack, h.wnd, nil, seg(i)))
	}
	send(0) // in order
	send(2) // segment 1 lost
	send(3)
	send(5) // segment 4 lost too
	ss := h.collect("ACKs", func(ss []tcpSeg) bool { b, _ := sackBlocksOf(ss); return len(b) == 2 })
	blocks, ack := sackBlocksOf(ss)
	if ack != at(1) {
		t.Fatalf("ACK %d, want %d (the hole)", ack-base, at(1)-base)
	}
	want := []header.TCPSACKBlock{{Start: at(5), End: at(6)}, {Start: at(2), End: at(4)}}
	if fmt.Sprint(blocks) != fmt.Sprint(want) {
		t.Fatalf("SACK blocks %v, want %v (latest first)", blocks, want)
	}
	if got := tcpReadN(t, peer, 1000); !bytes.Equal(got, seg(0)) {
		t.Fatal("host got other bytes than segment 0")
	}
	peer.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, _ := peer.Read(make([]byte, 10)); n != 0 {
		t.Fatal("data past the hole reached the host before the hole was filled")
	}
	send(1) // fills the first hole: 1..3 go
	ss = h.collect("ACK of 3", func(ss []tcpSeg) bool { _, a := sackBlocksOf(ss); return a == at(4) })
	if blocks, _ := sackBlocksOf(ss); len(blocks) != 1 || blocks[0] != (header.TCPSACKBlock{Start: at(5), End: at(6)}) {
		t.Fatalf("after the first hole: SACK blocks %v, want [5,6)", blocks)
	}
	send(4) // the last hole
	ss = h.collect("ACK of all", func(ss []tcpSeg) bool { _, a := sackBlocksOf(ss); return a == at(6) })
	if blocks, _ := sackBlocksOf(ss); len(blocks) != 0 {
		t.Fatalf("SACK blocks %v with nothing out of order", blocks)
	}
	var want6 []byte
	for i := 1; i < 6; i++ {
		want6 = append(want6, seg(i)...)
	}
	if got := tcpReadN(t, peer, len(want6)); !bytes.Equal(got, want6) {
		t.Fatal("host got segments 1-5 other than in order")
	}
	if h.flow().ooo != nil || h.tab.oooLive != 0 {
		t.Error("the out-of-order buffer was not given back")
	}
	if h.stats.OutOfOrderKept.Load() != 3000 {
		t.Errorf("kept %d bytes out of order, want 3000", h.stats.OutOfOrderKept.Load())
	}
}

// sackSender plays a SACK sender of a stream cut into segments: resend
// sends again every segment the latest ACK neither covers nor SACKs.
type sackSender struct {
	h      *tcpHarness
	base   uint32
	data   []byte
	size   int
	ack    uint32
	blocks []header.TCPSACKBlock
}

func (g *sackSender) send(i int) {
	end := min((i+1)*g.size, len(g.data))
	g.h.inject(g.h.frame(header.TCPFlagACK, g.base+uint32(i*g.size), g.h.ack, g.h.wnd, nil, g.data[i*g.size:end]))
}

// learn takes the last ACK among ss.
func (g *sackSender) learn(ss []tcpSeg) {
	if b, a := sackBlocksOf(ss); a != 0 {
		g.blocks, g.ack = b, a
	}
}

func (g *sackSender) done() bool { return g.ack == g.base+uint32(len(g.data)) }

func (g *sackSender) resend() {
	for i := 0; i*g.size < len(g.data); i++ {
		s, e := g.base+uint32(i*g.size), g.base+uint32(min((i+1)*g.size, len(g.data)))
		if !seqGT(e, g.ack) {
			continue
		}
		sacked := false
		for _, b := range g.blocks {
			if !seqLT(s, b.Start) && !seqGT(e, b.End) {
				sacked = true
			}
		}
		if !sacked {
			g.send(i)
		}
	}
}

// run resends until everything is acknowledged.
func (g *sackSender) run(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !g.done() {
		if time.Now().After(deadline) {
			t.Fatalf("acknowledged %d of %d bytes", g.ack-g.base, len(g.data))
		}
		g.learn(g.h.pump(5 * time.Millisecond))
		if !g.done() {
			g.resend()
			g.learn(g.h.flush())
		}
	}
}

// TestTCPOutOfOrderRandom: a stream sent in random order with duplicates,
// by a sender that resends what it has no word of (as a SACK sender
// does), arrives whole and in order.
func TestTCPOutOfOrderRandom(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpSackOpts)
	const n, size = 200, 700
	data := make([]byte, n*size)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(data))))
		got <- b
	}()
	g := &sackSender{h: h, base: h.seq, data: data, size: size}
	for _, i := range rng.Perm(n) {
		g.send(i)
		if rng.IntN(10) == 0 { // a duplicate
			g.send(i)
		}
		g.learn(h.flush())
	}
	g.run(t)
	select {
	case b := <-got:
		if !bytes.Equal(b, data) {
			t.Fatalf("host got %d bytes, not the stream in order", len(b))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("host did not get the stream")
	}
	if h.stats.OutOfOrderKept.Load() == 0 {
		t.Error("nothing was kept out of order")
	}
}

// TestTCPOutOfOrderWithoutSACK: a guest that did not offer SACK gets the
// old behaviour: data past a hole is dropped (and sent again).
func TestTCPOutOfOrderWithoutSACK(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	base := h.seq
	h.inject(h.frame(header.TCPFlagACK, base+1000, h.ack, h.wnd, nil, bytes.Repeat([]byte{'b'}, 1000)))
	ss := h.collect("dup ACK", func(ss []tcpSeg) bool { return len(ss) > 0 })
	if blocks, ack := sackBlocksOf(ss); len(blocks) != 0 || ack != base {
		t.Fatalf("ACK %d with SACK %v", ack-base, blocks)
	}
	h.inject(h.frame(header.TCPFlagACK, base, h.ack, h.wnd, nil, bytes.Repeat([]byte{'a'}, 1000)))
	h.collect("ACK", func(ss []tcpSeg) bool { _, a := sackBlocksOf(ss); return a == base+1000 })
	if got := tcpReadN(t, peer, 1000); !bytes.Equal(got, bytes.Repeat([]byte{'a'}, 1000)) {
		t.Fatal("host bytes")
	}
	if h.flow().ooo != nil || h.stats.OutOfOrderKept.Load() != 0 {
		t.Error("kept out-of-order data without SACK")
	}
}

// TestTCPOutOfOrderWaitsForSocketSpace: the hole is filled, and what was
// kept after it meets a full host socket; the rest goes out when space
// frees up (EPOLLOUT), since the guest, which has it SACKed, does not
// send it again.
func TestTCPOutOfOrderWaitsForSocketSpace(t *testing.T) {
	h, peer, base, data := keptPastHole(t)
	h.inject(h.frame(header.TCPFlagACK, base, h.ack, h.wnd, nil, data[:keptHole])) // the hole
	f := h.flow()
	if f.ooo == nil || f.ooo.n == 0 || f.ooo.ranges[0].start != f.seqFromGuest {
		t.Fatalf("after the hole: %d bytes written; want a full socket with kept data next (SO_SNDBUF 4096, the peer's SO_RCVBUF 4096)", f.seqFromGuest-base)
	}
	// The guest has everything ACKed or SACKed: it sends nothing more.
	h.expectStream(peer, data, func() bool { return f.seqFromGuest == base+uint32(len(data)) })
}

// TestTCPOutOfOrderAfterShortWrite: the guest sends the hole again in one
// large segment that overlaps what was kept after it, and the socket takes
// only part of it, past the start of the kept data. What is left of the
// kept data still goes out at EPOLLOUT: it started before the next byte and
// was never written again (the guest, which has it SACKed, does not send it
// again).
func TestTCPOutOfOrderAfterShortWrite(t *testing.T) {
	h, peer, base, data := keptPastHole(t)
	const again = keptHole + 40*keptSize // the hole and most of what was kept
	h.inject(h.frame(header.TCPFlagACK, base, h.ack, h.wnd, nil, data[:again]))
	f := h.flow()
	if w := f.seqFromGuest - base; w <= keptHole || w >= again {
		t.Fatalf("%d bytes written; want a short write past the hole (%d) and before %d", w, keptHole, again)
	}
	h.expectStream(peer, data, func() bool { return f.seqFromGuest == base+uint32(len(data)) })
}

// keptHole, keptSize and keptSegs shape keptPastHole's stream: a hole of
// keptHole bytes, then keptSegs segments of keptSize.
const keptHole, keptSize, keptSegs = 100, 1000, 60

// keptPastHole connects a SACK guest to a peer behind 4 KiB socket buffers
// and sends everything of data but its first keptHole bytes, which the
// table keeps; base is data's first sequence number.
func keptPastHole(t *testing.T) (h *tcpHarness, peer *net.TCPConn, base uint32, data []byte) {
	h = tcpNewHarness(t, Config{SndBuf: 4096})
	ln := h.listen()
	h.setRcvBuf(ln, 4096)
	peer = h.establish(ln, tcpSackOpts)
	base = h.seq
	data = bytes.Repeat([]byte("0123456789"), (keptHole+keptSegs*keptSize)/10)
	for i := range keptSegs {
		o := keptHole + i*keptSize
		h.inject(h.frame(header.TCPFlagACK, base+uint32(o), h.ack, h.wnd, nil, data[o:o+keptSize]))
	}
	return h, peer, base, data
}

// expectStream pumps the table until written reports true and fails the
// test unless the host peer then read exactly data.
func (h *tcpHarness) expectStream(peer io.Reader, data []byte, written func() bool) {
	h.t.Helper()
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(data))))
		got <- b
	}()
	h.collect("everything written", func([]tcpSeg) bool { return written() })
	select {
	case b := <-got:
		if !bytes.Equal(b, data) {
			h.t.Fatalf("host got %d bytes, not the stream in order", len(b))
		}
	case <-time.After(5 * time.Second):
		h.t.Fatal("host did not get the stream")
	}
}

// TestTCPOutOfOrderBufferGoesBack: a connection that leaves the table (a
// hand-over, a reset) gives its out-of-order buffer back to the pool.
func TestTCPOutOfOrderBufferGoesBack(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	h.establish(ln, tcpSackOpts)
	h.inject(h.frame(header.TCPFlagACK, h.seq+100, h.ack, h.wnd, nil, []byte("past the hole")))
	f := h.flow()
	if f.ooo == nil || h.tab.oooLive != 1 {
		t.Fatal("nothing kept")
	}
	var d testDir
	h.tab.SetDirectory(&d)
	if _, fd, ok := h.tab.HandOff(h.now, f.fp); !ok {
		t.Fatal("hand-off refused")
	} else {
		unix.Close(fd)
	}
	if h.tab.oooLive != 0 || len(h.tab.oooPool) != 1 {
		t.Errorf("after the hand-off: %d buffers out, %d in the pool; want 0 and 1", h.tab.oooLive, len(h.tab.oooPool))
	}
}

// testDir is a directory of one table.
type testDir struct{ fps map[uint64]int }

func (d *testDir) Sum(b [38]byte) uint64 {
	var s uint64 = 14695981039346656037
	for _, c := range b {
		s = (s ^ uint64(c)) * 1099511628211
	}
	return s | 1
}
func (d *testDir) Add(fp uint64) {
	if d.fps == nil {
		d.fps = map[uint64]int{}
	}
	d.fps[fp]++
}
func (d *testDir) Remove(fp uint64)     { d.fps[fp]-- }
func (d *testDir) Fetch(fp uint64) bool { return false }

// A segment that would need a range past oooRanges is dropped alone: what
// is kept (and SACKed to the guest) stays kept. Dropping the whole buffer
// left the guest, which believes the SACKed data arrived, to find out by
// its retransmission timeout.
func TestTCPOutOfOrderTooManyRangesKeepsTheRest(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpSackOpts)
	seg := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 1000) }
	base := h.seq
	at := func(i int) uint32 { return base + uint32(1000*i) }
	send := func(i int) {
		h.inject(h.frame(header.TCPFlagACK, at(i), h.ack, h.wnd, nil, seg(i)))
	}
	last := 2*oooRanges + 2
	send(0) // in order
	// Segments 2, 4, ..., 2*oooRanges make oooRanges ranges behind holes;
	// the next even one would make one more.
	for i := 2; i <= last; i += 2 {
		send(i)
	}
	ss := h.collect("SACKs", func(ss []tcpSeg) bool { b, _ := sackBlocksOf(ss); return len(b) > 0 })
	if b, ack := sackBlocksOf(ss); ack != at(1) || len(b) == 0 {
		t.Fatalf("ACK %d with SACK blocks %v, want the hole at 1000 and blocks", ack-base, b)
	}
	o := h.flow().ooo
	if o == nil || o.n != oooRanges {
		t.Fatalf("out-of-order buffer %v after one range too many, want %d ranges kept", o, oooRanges)
	}
	if kept := h.stats.OutOfOrderKept.Load(); kept != 1000*oooRanges {
		t.Fatalf("kept %d bytes, want %d", kept, 1000*oooRanges)
	}
	// The holes filled, and the dropped segment sent again: all in order.
	for i := 1; i < last; i += 2 {
		send(i)
	}
	send(last)
	var want []byte
	for i := 0; i <= last; i++ {
		want = append(want, seg(i)...)
	}
	if got := tcpReadN(t, peer, len(want)); !bytes.Equal(got, want) {
		t.Fatal("host got other bytes than the segments in order")
	}
}

// TestTCPOutOfOrderFinTaken: the guest's last segment carries its FIN and
// arrives past a hole. It is kept (SACK), and once the hole is filled the
// peer reads all the data and then the end of the stream, and the guest's
// FIN is acknowledged: it was forgotten with the segment's data kept, and
// the guest had to send it again after its retransmission timeout.
func TestTCPOutOfOrderFinTaken(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	peer := h.establish(h.listen(), tcpSackOpts)
	h.flush()
	first, last := []byte("the hole, sent late"), []byte("and the end")
	h.inject(h.frame(header.TCPFlagACK|header.TCPFlagFIN, h.seq+uint32(len(first)), h.ack, h.wnd, nil, last))
	end := h.seq + uint32(len(first)+len(last)) + 1
	dup := h.flush()
	if len(dup) == 0 || dup[0].opts.NumSACKBlocks != 1 || dup[0].opts.SACKBlocks[0].End != end {
		t.Fatalf("got %s (%+v), want an ACK SACKing the kept segment and its FIN, up to %d", segsString(dup), dup, end)
	}
	h.sendAck(first) // the hole
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(peer); err != nil || string(b) != string(first)+string(last) {
		t.Fatalf("peer read %q, %v; want the data in order, then EOF", b, err)
	}
	if f := h.flow(); f == nil || !f.has(evGuestFin) || f.seqFromGuest != end {
		t.Fatalf("the guest's FIN was not taken: flow %+v", f)
	}
	ss := h.flush()
	if len(ss) == 0 || ss[len(ss)-1].ack != end {
		t.Fatalf("got %s, want the FIN acknowledged (%d)", segsString(ss), end)
	}
}

// TestTCPOutOfOrderBareFinTaken: a guest's FIN of its own, past a hole, is
// kept like one that comes with data: SACKed (at the end of the kept data
// it follows, or in a block of its own, first while it is the latest), and
// taken once the hole is filled, without the guest sending it again.
func TestTCPOutOfOrderBareFinTaken(t *testing.T) {
	for _, tc := range []struct {
		name string
		kept string // data kept between the hole and the FIN
	}{{"after kept data", "kept after the hole"}, {"alone", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			h := tcpNewHarness(t, Config{})
			peer := h.establish(h.listen(), tcpSackOpts)
			h.flush()
			hole := []byte("the hole, sent late")
			at := h.seq + uint32(len(hole))
			if tc.kept != "" {
				h.inject(h.frame(header.TCPFlagACK, at, h.ack, h.wnd, nil, []byte(tc.kept)))
				h.flush()
			}
			fin := at + uint32(len(tc.kept))
			h.inject(h.frame(header.TCPFlagACK|header.TCPFlagFIN, fin, h.ack, h.wnd, nil, nil))
			dup := h.flush()
			if len(dup) == 0 {
				t.Fatal("no ACK for the FIN past the hole")
			}
			o := dup[0].opts
			want := []header.TCPSACKBlock{{Start: fin, End: fin + 1}}
			if tc.kept != "" {
				want = []header.TCPSACKBlock{{Start: at, End: fin + 1}}
			}
			if got := o.SACKBlocks[:o.NumSACKBlocks]; !slices.Equal(got, want) || dup[0].ack != h.seq {
				t.Fatalf("got %s, SACK %+v; want the ACK at the hole (%d) SACKing %+v", segsString(dup), got, h.seq, want)
			}
			// Part of the hole first: the FIN keeps waiting.
			h.sendAck(hole[:4])
			if f := h.flow(); f == nil || f.has(evGuestFin) || f.ooo == nil || !f.ooo.hasFin {
				t.Fatalf("the FIN was taken, or forgotten, before the hole was filled: %+v", f)
			}
			h.sendAck(hole[4:])
			peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			if b, err := io.ReadAll(peer); err != nil || string(b) != string(hole)+tc.kept {
				t.Fatalf("peer read %q, %v; want the data in order, then EOF", b, err)
			}
			if f := h.flow(); f == nil || !f.has(evGuestFin) || f.seqFromGuest != fin+1 {
				t.Fatalf("the guest's FIN was not taken: flow %+v", f)
			}
			ss := h.flush()
			if len(ss) == 0 || ss[len(ss)-1].ack != fin+1 {
				t.Fatalf("got %s, want the FIN acknowledged (%d)", segsString(ss), fin+1)
			}
		})
	}
}

// TestTCPOutOfOrderBareFinBlockOrder: a FIN kept on its own is the first
// SACK block while it is the latest segment kept, and goes after the data
// kept later (RFC 2018: the first block reports the latest segment).
func TestTCPOutOfOrderBareFinBlockOrder(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	h.establish(h.listen(), tcpSackOpts)
	h.flush()
	a := h.seq + 100   // kept data [a, a+10)
	fin := h.seq + 200 // the FIN, after a second hole
	h.inject(h.frame(header.TCPFlagACK|header.TCPFlagFIN, fin, h.ack, h.wnd, nil, nil))
	h.flush()
	h.inject(h.frame(header.TCPFlagACK, a, h.ack, h.wnd, nil, make([]byte, 10)))
	ss := h.flush()
	want := []header.TCPSACKBlock{{Start: a, End: a + 10}, {Start: fin, End: fin + 1}}
	if len(ss) == 0 || !slices.Equal(ss[0].opts.SACKBlocks[:ss[0].opts.NumSACKBlocks], want) {
		t.Fatalf("got %s (%+v), want SACK blocks %+v", segsString(ss), ss, want)
	}
	// Data past the FIN is past the end of the stream: not kept.
	h.inject(h.frame(header.TCPFlagACK, fin+1, h.ack, h.wnd, nil, make([]byte, 10)))
	ss = h.flush()
	if len(ss) == 0 || !slices.Equal(ss[0].opts.SACKBlocks[:ss[0].opts.NumSACKBlocks], want) {
		t.Fatalf("after data past the FIN: got %s (%+v), want SACK blocks %+v", segsString(ss), ss, want)
	}
}

// TestTCPOutOfOrderBareFinEdges: the SACK block that reports a kept FIN is
// the first even when it ends a range kept before another (RFC 2018 §4); a
// FIN sent again past the hole changes nothing; a FIN with data kept past
// it is not the end of the stream and is not kept.
func TestTCPOutOfOrderBareFinEdges(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	h.establish(h.listen(), tcpSackOpts)
	h.flush()
	a, b := h.seq+100, h.seq+200
	blocks := func() []header.TCPSACKBlock {
		t.Helper()
		ss := h.flush()
		if len(ss) == 0 {
			t.Fatal("no ACK")
		}
		o := ss[0].opts
		return o.SACKBlocks[:o.NumSACKBlocks]
	}
	h.inject(h.frame(header.TCPFlagACK, b, h.ack, h.wnd, nil, make([]byte, 10)))
	h.flush()
	h.inject(h.frame(header.TCPFlagACK, a, h.ack, h.wnd, nil, make([]byte, 10)))
	h.flush()
	h.inject(h.frame(header.TCPFlagACK|header.TCPFlagFIN, b+10, h.ack, h.wnd, nil, nil))
	want := []header.TCPSACKBlock{{Start: b, End: b + 11}, {Start: a, End: a + 10}}
	if got := blocks(); !slices.Equal(got, want) {
		t.Fatalf("after the FIN: SACK blocks %+v, want %+v (the FIN's block first)", got, want)
	}
	h.inject(h.frame(header.TCPFlagACK|header.TCPFlagFIN, b+10, h.ack, h.wnd, nil, nil))
	if got := blocks(); !slices.Equal(got, want) {
		t.Fatalf("after the FIN again: SACK blocks %+v, want %+v", got, want)
	}
	if f := h.flow(); f.ooo == nil || !f.ooo.hasFin || f.ooo.fin != b+10 {
		t.Fatal("the kept FIN changed when the guest sent it again")
	}

	// Another connection: data kept past where a FIN then claims the
	// stream ends. The FIN is not kept.
	h2 := tcpNewHarness(t, Config{})
	h2.establish(h2.listen(), tcpSackOpts)
	h2.flush()
	c := h2.seq + 100
	h2.inject(h2.frame(header.TCPFlagACK, c, h2.ack, h2.wnd, nil, make([]byte, 10)))
	h2.flush()
	h2.inject(h2.frame(header.TCPFlagACK|header.TCPFlagFIN, c+5, h2.ack, h2.wnd, nil, nil))
	h2.flush()
	if f := h2.flow(); f.ooo != nil && f.ooo.hasFin {
		t.Fatalf("a FIN inside kept data was kept (fin %d)", f.ooo.fin-c)
	}
}

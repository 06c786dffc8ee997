package frontend

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func TestNeedEvent(t *testing.T) {
	cases := []struct {
		event, newIdx, old uint16
		want               bool
	}{
		{0, 1, 0, true},           // event at the first new entry
		{1, 1, 0, false},          // device wants a kick only after entry 1
		{5, 10, 3, true},          // event inside (old, new]
		{10, 10, 3, false},        // event == new: not yet passed
		{2, 10, 3, false},         // event before old: already notified
		{0xffff, 2, 0xfffe, true}, // wraps
		{1, 2, 0xfffe, true},
		{2, 2, 0xfffe, false},
	}
	for _, c := range cases {
		if got := NeedEvent(c.event, c.newIdx, c.old); got != c.want {
			t.Errorf("NeedEvent(%d, %d, %d) = %v, want %v", c.event, c.newIdx, c.old, got, c.want)
		}
	}
}

func TestRingAreaSizes(t *testing.T) {
	d, a, u := RingAreaSizes(256)
	if d != 4096 || a != 4+512+2 || u != 4+2048+2 {
		t.Fatalf("sizes for 256: %d %d %d", d, a, u)
	}
}

func TestChainShapePieces(t *testing.T) {
	cases := []struct {
		s     ChainShape
		total int
		want  []int
	}{
		{ChainShape{}, 100, []int{100}},
		{ChainShape{HeaderApart: true}, 100, []int{12, 88}},
		{ChainShape{Chunk: 30}, 100, []int{30, 30, 30, 10}},
		{ChainShape{HeaderApart: true, Chunk: 50}, 100, []int{12, 50, 38}},
		{ChainShape{HeaderApart: true}, 12, []int{12}},
	}
	for _, c := range cases {
		got := c.s.pieces(c.total, 12)
		if len(got) != len(c.want) {
			t.Errorf("%+v %d: %v, want %v", c.s, c.total, got, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%+v %d: %v, want %v", c.s, c.total, got, c.want)
			}
		}
	}
}

func frameOf(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func TestTXShapesReachDevice(t *testing.T) {
	feat := Bit(FeatVersion1) | Bit(FeatIndirectDesc)
	shapes := []ChainShape{
		{},
		{HeaderApart: true},
		{Chunk: 7},
		{HeaderApart: true, Chunk: 100},
		{Indirect: true},
		{Indirect: true, Chunk: 13},
	}
	for _, layout := range []Layout{LayoutSingle, LayoutPCHole, LayoutAdjacent} {
		for _, s := range shapes {
			p, _, tx := newSimPair(t, layout, 256, feat)
			p.TXShape = s
			before := p.mem.FreeBytes()
			frames := [][]byte{frameOf(60, 1), frameOf(1514, 2), frameOf(42, 3)}
			if err := p.SubmitTXHdr(NetHdr{Flags: NetHdrFNeedsCsum, CsumStart: 34, CsumOffset: 16}, frames...); err != nil {
				t.Fatalf("layout %d shape %+v: %v", layout, s, err)
			}
			if p.TX.Kicks != 1 {
				t.Errorf("shape %+v: %d kicks for one batch, want 1", s, p.TX.Kicks)
			}
			for i, want := range frames {
				head, bufs, ok := tx.pop()
				if !ok {
					t.Fatalf("shape %+v: frame %d not available", s, i)
				}
				for _, b := range bufs {
					if b.Write {
						t.Fatalf("TX buffer marked device-writable")
					}
				}
				got := tx.read(bufs)
				h, _ := DecodeNetHdr(got, 12)
				if h.Flags != NetHdrFNeedsCsum || h.CsumStart != 34 || h.CsumOffset != 16 {
					t.Errorf("header %+v", h)
				}
				if !bytes.Equal(got[12:], want) {
					t.Errorf("shape %+v frame %d: bytes differ", s, i)
				}
				tx.push(head, 0)
			}
			n, err := p.ReclaimTX()
			if err != nil || n != 3 {
				t.Fatalf("reclaim: %d %v", n, err)
			}
			if p.TX.NumFree() != 256 || p.mem.FreeBytes() != before {
				t.Errorf("shape %+v: leak: %d free descs, %d/%d free bytes", s, p.TX.NumFree(), p.mem.FreeBytes(), before)
			}
		}
	}
}

func TestTXRingFull(t *testing.T) {
	p, _, _ := newSimPair(t, LayoutSingle, 16, Bit(FeatVersion1))
	p.TXShape = ChainShape{HeaderApart: true}
	var frames [][]byte
	for i := 0; i < 9; i++ {
		frames = append(frames, frameOf(100, byte(i)))
	}
	err := p.SubmitTX(frames...)
	if !errors.Is(err, ErrRingFull) {
		t.Fatalf("9 two-descriptor chains in 16: %v", err)
	}
	if got := p.TX.AvailIdx(); got != 8 {
		t.Fatalf("avail idx %d, want the 8 that fit published", got)
	}
}

func TestRXMergeableReassembly(t *testing.T) {
	feat := Bit(FeatVersion1) | Bit(FeatMrgRxbuf) | Bit(FeatEventIdx)
	p, rx, _ := newSimPair(t, LayoutPCHole, 32, feat)
	if err := p.PostRX(8, 1536); err != nil {
		t.Fatal(err)
	}
	frame := frameOf(4000, 9) // 12 + 4000 bytes: three 1536-byte buffers
	small := frameOf(60, 4)
	hdr := make([]byte, 12)
	NetHdr{NumBuffers: 3}.Encode(hdr)
	stream := append(hdr, frame...)
	for i := 0; i < 3; i++ {
		head, bufs, ok := rx.pop()
		if !ok {
			t.Fatal("rx buffer missing")
		}
		part := stream[min(i*1536, len(stream)):min((i+1)*1536, len(stream))]
		if n := rx.write(bufs, part); n != uint32(len(part)) {
			t.Fatalf("wrote %d", n)
		}
		rx.push(head, uint32(len(part)))
		if i == 0 {
			// Only part of the frame is used: nothing to return yet.
			if fr, err := p.ReceiveRX(10 * time.Millisecond); err == nil || len(fr) != 0 {
				t.Fatalf("partial frame returned: %d frames, %v", len(fr), err)
			}
			if rx.usedEvent() != p.RX.LastUsed() {
				t.Fatalf("used_event %d, want %d", rx.usedEvent(), p.RX.LastUsed())
			}
		}
	}
	head, bufs, _ := rx.pop()
	NetHdr{NumBuffers: 1}.Encode(hdr)
	rx.push(head, rx.write(bufs, append(hdr, small...)))
	frames, err := p.ReceiveRX(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(frames) != 2 || frames[0].Buffers != 3 || !bytes.Equal(frames[0].Data, frame) || !bytes.Equal(frames[1].Data, small) {
		t.Fatalf("frames: %d, first %d buffers %d bytes", len(frames), frames[0].Buffers, len(frames[0].Data))
	}
	if p.RX.Outstanding() != 4 {
		t.Fatalf("%d RX buffers outstanding, want 4", p.RX.Outstanding())
	}
}

func TestRXAssemblerErrors(t *testing.T) {
	a := rxAssembler{hdrLen: 12, mrg: true}
	if _, _, err := a.add(make([]byte, 5)); err == nil {
		t.Error("short buffer accepted")
	}
	if _, _, err := a.add(make([]byte, 20)); err == nil {
		t.Error("num_buffers 0 accepted")
	}
	b := rxAssembler{hdrLen: 12}
	f, done, err := b.add(append(make([]byte, 12), 1, 2, 3))
	if err != nil || !done || len(f.Data) != 3 {
		t.Errorf("non-mergeable: %+v %v %v", f, done, err)
	}
}

func TestRXChainShapesAndOverflowCheck(t *testing.T) {
	feat := Bit(FeatVersion1) | Bit(FeatIndirectDesc)
	for _, s := range []ChainShape{{}, {HeaderApart: true}, {Chunk: 100}, {Indirect: true, Chunk: 512}} {
		p, rx, _ := newSimPair(t, LayoutAdjacent, 64, feat)
		p.RXShape = s
		if err := p.PostRX(2, 2048); err != nil {
			t.Fatal(err)
		}
		head, bufs, _ := rx.pop()
		var capacity uint32
		for _, b := range bufs {
			if !b.Write {
				t.Fatal("RX buffer not device-writable")
			}
			capacity += b.Len
		}
		if capacity != 2048 {
			t.Fatalf("shape %+v: capacity %d", s, capacity)
		}
		want := frameOf(1000, 5)
		rx.push(head, rx.write(bufs, append(make([]byte, 12), want...)))
		fr, err := p.ReceiveRX(time.Second)
		if err != nil || len(fr) != 1 || !bytes.Equal(fr[0].Data, want) {
			t.Fatalf("shape %+v: %v", s, err)
		}
		// A device claiming more bytes than the chain holds is caught.
		head, _, _ = rx.pop()
		rx.push(head, 4096)
		if _, err := p.ReceiveRX(time.Second); err == nil {
			t.Fatalf("shape %+v: oversized used len accepted", s)
		}
	}
}

func TestPublishHonoursAvailEvent(t *testing.T) {
	p, _, tx := newSimPair(t, LayoutSingle, 16, Bit(FeatVersion1)|Bit(FeatEventIdx))
	tx.setAvailEvent(3) // kick me when entry 3 is published
	for i := 0; i < 5; i++ {
		if err := p.SubmitTX(frameOf(60, 0)); err != nil {
			t.Fatal(err)
		}
	}
	// Publishes moved idx 0→1, 1→2, 2→3, 3→4, 4→5: only 3→4 crosses 3.
	if p.TX.Kicks != 1 || p.TX.KicksSuppressed != 4 {
		t.Fatalf("kicks %d suppressed %d, want 1 and 4", p.TX.Kicks, p.TX.KicksSuppressed)
	}
}

func TestPublishHonoursNoNotify(t *testing.T) {
	p, _, _ := newSimPair(t, LayoutSingle, 16, Bit(FeatVersion1))
	*u32at(p.TX.used, 0) = uint32(UsedFNoNotify)
	if err := p.SubmitTX(frameOf(60, 0)); err != nil {
		t.Fatal(err)
	}
	if p.TX.Kicks != 0 || p.TX.KicksSuppressed != 1 {
		t.Fatalf("kicks %d suppressed %d", p.TX.Kicks, p.TX.KicksSuppressed)
	}
}

func TestPopUsedRejectsUnknownHead(t *testing.T) {
	p, _, tx := newSimPair(t, LayoutSingle, 16, Bit(FeatVersion1))
	tx.push(7, 0)
	if _, err := p.ReclaimTX(); err == nil {
		t.Fatal("used element for a head never made available accepted")
	}
}

func TestWaitCallTimesOut(t *testing.T) {
	p, _, _ := newSimPair(t, LayoutSingle, 16, Bit(FeatVersion1))
	start := time.Now()
	if _, err := p.ReceiveRX(30 * time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("err %v", err)
	}
	if time.Since(start) < 25*time.Millisecond {
		t.Fatal("returned early")
	}
}

func TestRawAccess(t *testing.T) {
	p, _, tx := newSimPair(t, LayoutSingle, 16, Bit(FeatVersion1))
	p.TX.SetDesc(3, Desc{Addr: 0x1000, Len: 0xffffffff, Flags: DescFNext, Next: 3})
	if d := p.TX.ReadDesc(3); d.Len != 0xffffffff || d.Next != 3 {
		t.Fatalf("desc %+v", d)
	}
	if err := p.TX.PushRawHead(3); err != nil {
		t.Fatal(err)
	}
	if p.TX.AvailIdx() != 1 {
		t.Fatalf("avail idx %d", p.TX.AvailIdx())
	}
	p.TX.SetAvailIdx(40)
	if tx.r.AvailIdx() != 40 {
		t.Fatal("avail idx not stored")
	}
}

package frontend

import (
	"bytes"
	"errors"
	"testing"
)

func TestFixedRingTXAndRX(t *testing.T) {
	p, rxDev, txDev := newSimPair(t, LayoutSingle, 8, Bit(FeatVersion1)|Bit(FeatEventIdx))
	tx, err := p.TX.Fixed(256, false)
	if err != nil {
		t.Fatal(err)
	}
	rx, err := p.RX.Fixed(128, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.TX.Fixed(256, false); !errors.Is(err, ErrNotFresh) {
		t.Fatalf("second Fixed on the same ring: %v, want ErrNotFresh", err)
	}
	if p.TX.NumFree() != 0 || tx.NumFree() != 8 {
		t.Fatalf("free: chain allocator %d, fixed %d", p.TX.NumFree(), tx.NumFree())
	}

	// TX: frames written straight into the buffers reach the device intact.
	for i := 0; i < 20; i++ {
		id, ok := tx.Get()
		if !ok {
			t.Fatalf("frame %d: no free descriptor", i)
		}
		frame := bytes.Repeat([]byte{byte(i)}, 10+i)
		copy(tx.Buf(id), frame)
		tx.Post(id, len(frame))
		if _, err := tx.Publish(); err != nil {
			t.Fatal(err)
		}
		head, bufs, ok := txDev.pop()
		if !ok || head != id || len(bufs) != 1 || bufs[0].Write {
			t.Fatalf("frame %d: device popped head %d bufs %+v ok %v, want head %d", i, head, bufs, ok, id)
		}
		if got := txDev.read(bufs); !bytes.Equal(got, frame) {
			t.Fatalf("frame %d: device read %x, want %x", i, got, frame)
		}
		txDev.push(head, 0)
		u, ok, err := tx.PopUsed()
		if err != nil || !ok || u.ID != uint32(id) {
			t.Fatalf("frame %d: PopUsed %+v %v %v", i, u, ok, err)
		}
		tx.Put(uint16(u.ID))
	}
	if tx.Outstanding() != 0 || tx.NumFree() != 8 {
		t.Fatalf("after TX: outstanding %d free %d", tx.Outstanding(), tx.NumFree())
	}

	// RX: every buffer posted writable at full size; used lengths checked.
	for {
		id, ok := rx.Get()
		if !ok {
			break
		}
		rx.Post(id, 0)
	}
	if _, err := rx.Publish(); err != nil {
		t.Fatal(err)
	}
	head, bufs, ok := rxDev.pop()
	if !ok || len(bufs) != 1 || !bufs[0].Write || bufs[0].Len != 128 {
		t.Fatalf("rx pop: head %d bufs %+v ok %v", head, bufs, ok)
	}
	n := rxDev.write(bufs, []byte("hello"))
	rxDev.push(head, n)
	u, ok, err := rx.PopUsed()
	if err != nil || !ok || u.ID != uint32(head) || u.Len != 5 || string(rx.Buf(head)[:5]) != "hello" {
		t.Fatalf("rx used %+v ok %v err %v", u, ok, err)
	}
	// A device that returns a head twice, or overflows a buffer, is caught.
	rxDev.push(head, 5)
	if _, _, err := rx.PopUsed(); err == nil {
		t.Fatal("duplicate used head accepted")
	}
	head2, _, _ := rxDev.pop()
	rxDev.push(head2, 129)
	if _, _, err := rx.PopUsed(); err == nil {
		t.Fatal("used length beyond the buffer accepted")
	}
}

func BenchmarkFixedRingRoundTrip(b *testing.B) {
	mem, err := NewMemory(4<<20, LayoutSingle)
	if err != nil {
		b.Fatal(err)
	}
	defer mem.Close()
	r, err := newRing(mem, 1, 256, true, false, false)
	if err != nil {
		b.Fatal(err)
	}
	defer r.closeFDs()
	f, err := r.Fixed(2048, false)
	if err != nil {
		b.Fatal(err)
	}
	dev := &simDev{r: r, mem: mem}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id, _ := f.Get()
		f.Post(id, 1500)
		r.published = r.availIdx
		r.storeAvailWord()
		dev.last++
		dev.push(id, 0)
		u, _, _ := f.PopUsed()
		f.Put(uint16(u.ID))
	}
}

package frontend

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
)

// simDev is a minimal device side written for these tests only: it reads the
// rings the way the virtio spec describes, so the driver code is checked
// against the layout rather than against itself.
type simDev struct {
	t    *testing.T
	r    *Ring
	mem  *Memory
	last uint16
}

func (d *simDev) readDesc(b []byte, i uint16) Desc {
	o := int(i) * 16
	return Desc{
		Addr:  binary.LittleEndian.Uint64(b[o:]),
		Len:   binary.LittleEndian.Uint32(b[o+8:]),
		Flags: binary.LittleEndian.Uint16(b[o+12:]),
		Next:  binary.LittleEndian.Uint16(b[o+14:]),
	}
}

func (d *simDev) pop() (uint16, []Buffer, bool) {
	idx := uint16(atomic.LoadUint32(u32at(d.r.avail, 0)) >> 16)
	if idx == d.last {
		return 0, nil, false
	}
	head := binary.LittleEndian.Uint16(d.r.avail[4+2*int(d.last%d.r.size):])
	d.last++
	table := d.r.desc
	i := head
	var bufs []Buffer
	for n := 0; n < 1024; n++ {
		ds := d.readDesc(table, i)
		if ds.Flags&DescFIndirect != 0 {
			tb, err := d.mem.Slice(ds.Addr, uint64(ds.Len))
			if err != nil {
				d.t.Fatalf("indirect table: %v", err)
			}
			table, i = tb, 0
			continue
		}
		bufs = append(bufs, Buffer{GPA: ds.Addr, Len: ds.Len, Write: ds.Flags&DescFWrite != 0})
		if ds.Flags&DescFNext == 0 {
			return head, bufs, true
		}
		i = ds.Next
	}
	d.t.Fatalf("chain too long")
	return 0, nil, false
}

func (d *simDev) read(bufs []Buffer) []byte {
	var out []byte
	for _, b := range bufs {
		p := make([]byte, b.Len)
		if err := d.mem.Read(b.GPA, p); err != nil {
			d.t.Fatal(err)
		}
		out = append(out, p...)
	}
	return out
}

// write fills bufs with data and returns the bytes written.
func (d *simDev) write(bufs []Buffer, data []byte) uint32 {
	off := 0
	for _, b := range bufs {
		if off == len(data) {
			break
		}
		n := min(int(b.Len), len(data)-off)
		if err := d.mem.Write(b.GPA, data[off:off+n]); err != nil {
			d.t.Fatal(err)
		}
		off += n
	}
	return uint32(off)
}

func (d *simDev) push(head uint16, n uint32) {
	w := atomic.LoadUint32(u32at(d.r.used, 0))
	idx := uint16(w >> 16)
	e := d.r.used[4+8*int(idx%d.r.size):]
	binary.LittleEndian.PutUint32(e[0:], uint32(head))
	binary.LittleEndian.PutUint32(e[4:], n)
	atomic.StoreUint32(u32at(d.r.used, 0), w&0xffff|uint32(idx+1)<<16)
}

func (d *simDev) usedEvent() uint16 {
	return uint16(atomic.LoadUint32(u32at(d.r.avail, 4+2*int(d.r.size))))
}

func (d *simDev) setAvailEvent(v uint16) {
	atomic.StoreUint32(u32at(d.r.used, 4+8*int(d.r.size)), uint32(v))
}

// newSimPair builds a pair on fresh memory without any back-end.
func newSimPair(t *testing.T, layout Layout, size uint16, features uint64) (*Pair, *simDev, *simDev) {
	t.Helper()
	mem, err := NewMemory(4<<20, layout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	ev := features&Bit(FeatEventIdx) != 0
	rx, err := newRing(mem, 0, size, ev, false, false)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := newRing(mem, 1, size, ev, false, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rx.closeFDs(); tx.closeFDs() })
	p := &Pair{Index: 0, RX: rx, TX: tx, mem: mem,
		asm: rxAssembler{hdrLen: NetHdrLen(features), mrg: features&Bit(FeatMrgRxbuf) != 0}}
	return p, &simDev{t: t, r: rx, mem: mem}, &simDev{t: t, r: tx, mem: mem}
}

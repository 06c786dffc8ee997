package vqtest

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"vunet/virtqueue"
)

// Buf is one buffer of a chain the driver offers.
type Buf struct {
	GPA   uint64
	Len   uint32
	Write bool // device-writable
}

// Used is one element of the used ring.
type Used struct {
	ID  uint32
	Len uint32
}

// Driver is the guest side of one split virtqueue: ring layout, a
// descriptor free list, and a bump allocator for data buffers.
type Driver struct {
	G                          *GuestMemory
	Size                       uint16
	DescGPA, AvailGPA, UsedGPA uint64

	desc, avail, used []byte
	availIdx          uint16 // next avail slot
	lastUsed          uint16
	free              []uint16
	chainDescs        map[uint16][]uint16
	dataNext, dataEnd uint64
}

// NewDriver lays out a ring of size entries at ringGPA (desc table, then
// avail, then used 4-aligned) and uses [dataGPA, dataGPA+dataSize) for
// Alloc. The ring memory is zeroed.
func NewDriver(g *GuestMemory, size uint16, ringGPA, dataGPA, dataSize uint64) *Driver {
	d := ResumeDriver(g, size, ringGPA, dataGPA, dataSize)
	clear(d.desc)
	clear(d.avail)
	clear(d.used)
	d.availIdx, d.lastUsed = 0, 0
	return d
}

// RingLayout returns where a Driver puts the parts of a ring of size
// entries laid out at ringGPA: the descriptor table first, the avail ring
// after it, the used ring 4-aligned after that.
func RingLayout(size uint16, ringGPA uint64) (desc, avail, used uint64) {
	desc = ringGPA
	avail = desc + virtqueue.DescTableSize(size)
	used = (avail + virtqueue.AvailRingSize(size) + 3) &^ 3
	return desc, avail, used
}

// ResumeDriver takes over a ring that already exists in guest memory at
// ringGPA (laid out as NewDriver does), as a driver would after the
// memory was copied or handed over: the avail and used indices are read
// from the ring, nothing is cleared, and every descriptor counts as free
// (chains placed before are not reclaimed).
func ResumeDriver(g *GuestMemory, size uint16, ringGPA, dataGPA, dataSize uint64) *Driver {
	d := &Driver{G: g, Size: size}
	d.DescGPA, d.AvailGPA, d.UsedGPA = RingLayout(size, ringGPA)
	d.desc = g.Bytes(d.DescGPA, virtqueue.DescTableSize(size))
	d.avail = g.Bytes(d.AvailGPA, virtqueue.AvailRingSize(size))
	d.used = g.Bytes(d.UsedGPA, virtqueue.UsedRingSize(size))
	d.chainDescs = make(map[uint16][]uint16)
	for i := int(size) - 1; i >= 0; i-- {
		d.free = append(d.free, uint16(i))
	}
	d.dataNext, d.dataEnd = dataGPA, dataGPA+dataSize
	d.availIdx = virtqueue.LoadUint16(d.u16(d.avail, 2))
	d.lastUsed = d.UsedIdx()
	return d
}

// RingEnd returns the first guest address after the used ring.
func (d *Driver) RingEnd() uint64 { return d.UsedGPA + virtqueue.UsedRingSize(d.Size) }

// Addresses returns the ring addresses as SET_VRING_ADDR carries them.
func (d *Driver) Addresses() virtqueue.Addresses {
	return virtqueue.Addresses{
		Desc:  d.G.UserAddr(d.DescGPA),
		Avail: d.G.UserAddr(d.AvailGPA),
		Used:  d.G.UserAddr(d.UsedGPA),
	}
}

// Config returns a queue config for this ring with no eventfds.
func (d *Driver) Config(eventIdx, indirect bool) virtqueue.Config {
	return virtqueue.Config{
		Size: d.Size, Addr: d.Addresses(), EventIdx: eventIdx, Indirect: indirect,
		Kick: -1, Call: -1, Mem: d.G.Memory(),
	}
}

// Alloc returns n bytes of data memory (8-aligned), panicking when the data
// area is exhausted. Data memory is never freed: a test that posts buffers
// without end reposts its chains (PutAvail) or writes them at a fixed
// place (SetDesc).
func (d *Driver) Alloc(n uint64) uint64 {
	a := (d.dataNext + 7) &^ 7
	if a+n > d.dataEnd {
		panic("vqtest: data area exhausted")
	}
	d.dataNext = a + n
	return a
}

// PutDesc writes descriptor i of a table (the ring's or an indirect one).
func PutDesc(table []byte, i int, addr uint64, length uint32, flags, next uint16) {
	b := table[16*i : 16*i+16]
	binary.LittleEndian.PutUint64(b[0:], addr)
	binary.LittleEndian.PutUint32(b[8:], length)
	binary.LittleEndian.PutUint16(b[12:], flags)
	binary.LittleEndian.PutUint16(b[14:], next)
}

// SetDesc writes descriptor i of the ring's table directly (for hostile
// layouts; bypasses the free list).
func (d *Driver) SetDesc(i uint16, addr uint64, length uint32, flags, next uint16) {
	PutDesc(d.desc, int(i), addr, length, flags, next)
}

// DescTable returns the driver's view of the descriptor table.
func (d *Driver) DescTable() []byte { return d.desc }

// AddChain writes bufs as a chain of free descriptors and places its head
// in the next avail slot, unpublished (see Publish).
func (d *Driver) AddChain(bufs ...Buf) (head uint16, err error) {
	head, err = d.NewChain(bufs...)
	if err == nil {
		d.PutAvail(head)
	}
	return head, err
}

// NewChain writes bufs as a chain of free descriptors without placing it in
// the avail ring (PutAvail does, as often as the test likes).
func (d *Driver) NewChain(bufs ...Buf) (head uint16, err error) {
	if len(bufs) == 0 || len(bufs) > len(d.free) {
		return 0, fmt.Errorf("vqtest: %d buffers, %d free descriptors", len(bufs), len(d.free))
	}
	ids := make([]uint16, len(bufs))
	for i := range bufs {
		ids[i] = d.free[len(d.free)-1]
		d.free = d.free[:len(d.free)-1]
	}
	for i, b := range bufs {
		var flags, next uint16
		if b.Write {
			flags |= virtqueue.DescFlagWrite
		}
		if i+1 < len(bufs) {
			flags |= virtqueue.DescFlagNext
			next = ids[i+1]
		}
		d.SetDesc(ids[i], b.GPA, b.Len, flags, next)
	}
	d.chainDescs[ids[0]] = ids
	return ids[0], nil
}

// AddBuffers allocates a chain's buffers, copies readable's contents into
// the device-readable ones, adds writable device-writable buffers of the
// given lengths after them, and places the chain in the avail ring,
// unpublished. It panics when descriptors or data memory run out.
func (d *Driver) AddBuffers(readable [][]byte, writable ...uint32) (head uint16) {
	head = d.NewBuffers(readable, writable...)
	d.PutAvail(head)
	return head
}

// NewBuffers is AddBuffers without placing the chain in the avail ring.
func (d *Driver) NewBuffers(readable [][]byte, writable ...uint32) (head uint16) {
	bufs := make([]Buf, 0, len(readable)+len(writable))
	for _, r := range readable {
		gpa := d.Alloc(uint64(len(r)))
		copy(d.G.Bytes(gpa, uint64(len(r))), r)
		bufs = append(bufs, Buf{GPA: gpa, Len: uint32(len(r))})
	}
	for _, n := range writable {
		bufs = append(bufs, Buf{GPA: d.Alloc(uint64(n)), Len: n, Write: true})
	}
	head, err := d.NewChain(bufs...)
	if err != nil {
		panic(err)
	}
	return head
}

// Written returns a copy of the first n bytes the device wrote into the
// device-writable buffers of the chain at head (read through the
// descriptor table, which still holds the chain after PopUsed).
func (d *Driver) Written(head uint16, n uint32) []byte {
	var out []byte
	for i, hops := head, 0; n > 0 && hops < int(d.Size); hops++ {
		e := d.desc[16*int(i) : 16*int(i)+16]
		addr, l := binary.LittleEndian.Uint64(e[0:]), binary.LittleEndian.Uint32(e[8:])
		flags, next := binary.LittleEndian.Uint16(e[12:]), binary.LittleEndian.Uint16(e[14:])
		if flags&virtqueue.DescFlagWrite != 0 {
			l = min(l, n)
			out = append(out, d.G.Bytes(addr, uint64(l))...)
			n -= l
		}
		if flags&virtqueue.DescFlagNext == 0 {
			break
		}
		i = next
	}
	return out
}

// PutAvail places head in the next avail slot without publishing it.
func (d *Driver) PutAvail(head uint16) {
	binary.LittleEndian.PutUint16(d.avail[4+2*int(d.availIdx&(d.Size-1)):], head)
	d.availIdx++
}

// Publish makes every placed head visible with one avail.idx store and
// reports whether the driver should kick (EVENT_IDX rule when eventIdx,
// else the NO_NOTIFY flag).
func (d *Driver) Publish(eventIdx bool) (kick bool) {
	old := virtqueue.LoadUint16(d.u16(d.avail, 2))
	virtqueue.StoreUint16(d.u16(d.avail, 2), d.availIdx)
	if eventIdx {
		return virtqueue.NeedEvent(d.AvailEvent(), d.availIdx, old)
	}
	return d.UsedFlags()&virtqueue.UsedFlagNoNotify == 0
}

// SetAvailIdx stores avail.idx directly (hostile drivers) and moves the
// driver's own slot counter with it.
func (d *Driver) SetAvailIdx(v uint16) {
	d.availIdx = v
	virtqueue.StoreUint16(d.u16(d.avail, 2), v)
}

// Reclaim returns the used elements published since the last call and
// frees their descriptors.
func (d *Driver) Reclaim() []Used {
	var out []Used
	for {
		u, ok := d.PopUsed()
		if !ok {
			return out
		}
		out = append(out, u)
	}
}

// PopUsed returns the next used element, if any, and frees its descriptors.
func (d *Driver) PopUsed() (Used, bool) {
	if d.UsedIdx() == d.lastUsed {
		return Used{}, false
	}
	u := d.UsedElem(d.lastUsed)
	d.lastUsed++
	if ids, ok := d.chainDescs[uint16(u.ID)]; ok {
		d.free = append(d.free, ids...)
		delete(d.chainDescs, uint16(u.ID))
	}
	return u, true
}

// LastUsed returns the used index up to which Reclaim and PopUsed have
// consumed.
func (d *Driver) LastUsed() uint16 { return d.lastUsed }

// Free returns the number of free descriptors.
func (d *Driver) Free() int { return len(d.free) }

// UsedIdx loads used.idx.
func (d *Driver) UsedIdx() uint16 { return virtqueue.LoadUint16(d.u16(d.used, 2)) }

// UsedElem reads used ring slot i (modulo the size).
func (d *Driver) UsedElem(i uint16) Used {
	e := d.used[4+8*int(i&(d.Size-1)):]
	return Used{ID: binary.LittleEndian.Uint32(e), Len: binary.LittleEndian.Uint32(e[4:])}
}

// UsedFlags loads used.flags.
func (d *Driver) UsedFlags() uint16 { return virtqueue.LoadUint16(d.u16(d.used, 0)) }

// AvailEvent loads avail_event (EVENT_IDX).
func (d *Driver) AvailEvent() uint16 {
	return virtqueue.LoadUint16(d.u16(d.used, 4+8*int(d.Size)))
}

// SetUsedEvent stores used_event (EVENT_IDX).
func (d *Driver) SetUsedEvent(v uint16) {
	virtqueue.StoreUint16(d.u16(d.avail, 4+2*int(d.Size)), v)
}

// SetAvailFlags stores avail.flags (AvailFlagNoInterrupt).
func (d *Driver) SetAvailFlags(v uint16) { virtqueue.StoreUint16(d.u16(d.avail, 0), v) }

// SetUsedIdx stores used.idx directly (reconnect scenarios).
func (d *Driver) SetUsedIdx(v uint16) {
	virtqueue.StoreUint16(d.u16(d.used, 2), v)
	d.lastUsed = v
}

// u16 points into the driver's mapping for atomic access; the ring slices
// are 2-aligned by construction (the memfd mapping is page-aligned and the
// layout keeps every field at an even offset).
func (d *Driver) u16(b []byte, off int) *uint16 {
	_ = b[off+1]
	return (*uint16)(unsafe.Pointer(&b[off]))
}

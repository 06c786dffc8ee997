// Package vqtest simulates the driver (guest) side of split virtqueues over
// memfd-backed guest memory, for tests of virtqueue and of the code built on
// it. The memory is mapped twice, as a real front-end would have it: once
// through virtqueue.MapRegion (the device's view) and once as one flat
// mapping of the memfd (the driver's view).
//
// It is test support: misuse (addresses outside the memory, descriptor
// exhaustion) panics or returns errors without trying to be clever.
package vqtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
)

// UserBase is added to guest addresses to make the front-end virtual
// addresses of NewFlatMemory, so that tests notice mixing the two spaces.
const UserBase = 0x7f00_0000_0000

// GuestMemory is memfd-backed guest RAM.
type GuestMemory struct {
	fd      int
	specs   []virtqueue.RegionSpec
	regions []*virtqueue.Region
	mem     *virtqueue.Memory
	view    []byte // the whole memfd, driver side
}

// NewFlatMemory returns size bytes of guest memory at guest address 0 in
// one region.
func NewFlatMemory(size uint64) (*GuestMemory, error) {
	return NewGuestMemory(virtqueue.RegionSpec{GuestAddr: 0, Size: size, UserAddr: UserBase, MmapOffset: 0})
}

// NewGuestMemory creates a memfd large enough for every spec's MmapOffset+Size
// and maps each spec with virtqueue.MapRegion.
func NewGuestMemory(specs ...virtqueue.RegionSpec) (*GuestMemory, error) {
	var end uint64
	for _, s := range specs {
		end = max(end, s.MmapOffset+s.Size)
	}
	fd, err := unix.MemfdCreate("vqtest-guest", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	g := &GuestMemory{fd: fd, specs: specs}
	if err := unix.Ftruncate(fd, int64(end)); err != nil {
		g.Close()
		return nil, fmt.Errorf("ftruncate: %w", err)
	}
	if end > 0 {
		g.view, err = unix.Mmap(fd, 0, int(end), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("mmap driver view: %w", err)
		}
	}
	for _, s := range specs {
		r, err := virtqueue.MapRegion(fd, s)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.regions = append(g.regions, r)
	}
	if g.mem, err = virtqueue.NewMemory(g.regions); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// Memory returns the device's view.
func (g *GuestMemory) Memory() *virtqueue.Memory { return g.mem }

// FD returns the memfd (owned by g).
func (g *GuestMemory) FD() int { return g.fd }

// Close unmaps everything and closes the memfd.
func (g *GuestMemory) Close() error {
	var errs []error
	for _, r := range g.regions {
		errs = append(errs, r.Unmap())
	}
	g.regions = nil
	if g.view != nil {
		errs = append(errs, unix.Munmap(g.view))
		g.view = nil
	}
	if g.fd >= 0 {
		errs = append(errs, unix.Close(g.fd))
		g.fd = -1
	}
	return errors.Join(errs...)
}

func (g *GuestMemory) spec(gpa uint64) (virtqueue.RegionSpec, bool) {
	for _, s := range g.specs {
		if gpa >= s.GuestAddr && gpa-s.GuestAddr < s.Size {
			return s, true
		}
	}
	return virtqueue.RegionSpec{}, false
}

// Bytes returns the driver's view of n bytes at gpa, which must lie in one
// region. It panics otherwise (test misuse).
func (g *GuestMemory) Bytes(gpa, n uint64) []byte {
	s, ok := g.spec(gpa)
	if !ok || n > s.Size-(gpa-s.GuestAddr) {
		panic(fmt.Sprintf("vqtest: guest range %#x+%#x not in one region", gpa, n))
	}
	off := s.MmapOffset + gpa - s.GuestAddr
	return g.view[off : off+n : off+n]
}

// UserAddr translates gpa into the front-end virtual address space.
func (g *GuestMemory) UserAddr(gpa uint64) uint64 {
	s, ok := g.spec(gpa)
	if !ok {
		panic(fmt.Sprintf("vqtest: guest address %#x not mapped", gpa))
	}
	return s.UserAddr + gpa - s.GuestAddr
}

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
	d := &Driver{G: g, Size: size, DescGPA: ringGPA}
	d.AvailGPA = ringGPA + virtqueue.DescTableSize(size)
	d.UsedGPA = (d.AvailGPA + virtqueue.AvailRingSize(size) + 3) &^ 3
	d.desc = g.Bytes(d.DescGPA, virtqueue.DescTableSize(size))
	d.avail = g.Bytes(d.AvailGPA, virtqueue.AvailRingSize(size))
	d.used = g.Bytes(d.UsedGPA, virtqueue.UsedRingSize(size))
	clear(d.desc)
	clear(d.avail)
	clear(d.used)
	d.chainDescs = make(map[uint16][]uint16)
	for i := int(size) - 1; i >= 0; i-- {
		d.free = append(d.free, uint16(i))
	}
	d.dataNext, d.dataEnd = dataGPA, dataGPA+dataSize
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
// area is exhausted; Reset frees everything.
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
	d.PutAvail(ids[0])
	return ids[0], nil
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
	idx := d.UsedIdx()
	var out []Used
	for ; d.lastUsed != idx; d.lastUsed++ {
		u := d.UsedElem(d.lastUsed)
		out = append(out, u)
		if ids, ok := d.chainDescs[uint16(u.ID)]; ok {
			d.free = append(d.free, ids...)
			delete(d.chainDescs, uint16(u.ID))
		}
	}
	return out
}

// LastUsed returns the used index up to which Reclaim has consumed.
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

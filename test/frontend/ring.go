package frontend

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Descriptor flags of a split ring.
const (
	DescFNext     uint16 = 1
	DescFWrite    uint16 = 2
	DescFIndirect uint16 = 4
)

// Ring flags.
const (
	AvailFNoInterrupt uint16 = 1 // driver → device: don't call me
	UsedFNoNotify     uint16 = 1 // device → driver: don't kick me
)

// DescSize is the size of one split-ring descriptor.
const DescSize = 16

// ErrRingFull means no free descriptors are left for a new chain.
var ErrRingFull = errors.New("no free descriptors")

// ErrTimeout means a wait for the back-end ended without the expected event.
var ErrTimeout = errors.New("timed out waiting for the back-end")

// Desc is one descriptor as laid out in guest memory (little-endian).
type Desc struct {
	Addr  uint64
	Len   uint32
	Flags uint16
	Next  uint16
}

// Used is one used-ring element.
type Used struct {
	ID  uint32
	Len uint32
}

// Buffer is one piece of a descriptor chain.
type Buffer struct {
	GPA   uint64
	Len   uint32
	Write bool // device-writable
}

// chain is the driver's record of an outstanding head.
type chain struct {
	descs  []uint16 // ring descriptors used (one if indirect)
	bufs   []Buffer
	allocs []extent // guest memory to free when the chain comes back
}

// Ring is the driver side of one split virtqueue: it owns the three ring
// areas in guest memory, the free descriptor list and the kick/call eventfds.
type Ring struct {
	// Index is the vring index (2*pair for RX, 2*pair+1 for TX).
	Index int

	mem                        *Memory
	size                       uint16
	descGPA, availGPA, usedGPA uint64
	desc, avail, used          []byte
	kick, call                 int
	eventIdx                   bool

	free       []uint16
	chains     []*chain
	availIdx   uint16 // shadow of avail.idx, including unpublished entries
	published  uint16 // avail.idx last stored
	availFlags uint16
	lastUsed   uint16

	// Kicks counts eventfd writes; KicksSuppressed counts publishes where
	// the device's avail_event or NO_NOTIFY said no kick was needed.
	Kicks, KicksSuppressed uint64
	// Interrupts counts call eventfd wake-ups observed.
	Interrupts uint64
}

// RingAreaSizes returns the bytes of the descriptor table, the avail ring and
// the used ring for a queue of size n, including the event-index fields.
func RingAreaSizes(n uint16) (desc, avail, used uint64) {
	return DescSize * uint64(n), 4 + 2*uint64(n) + 2, 4 + 8*uint64(n) + 2
}

// newRing allocates the ring in guest memory. pollKick/pollCall mean no
// eventfd on that side (bit 8 of the vhost-user payload).
func newRing(mem *Memory, index int, size uint16, eventIdx, pollKick, pollCall bool) (*Ring, error) {
	if size == 0 || size&(size-1) != 0 {
		return nil, fmt.Errorf("ring %d: size %d is not a power of two", index, size)
	}
	r := &Ring{Index: index, mem: mem, size: size, eventIdx: eventIdx, kick: -1, call: -1}
	ds, as, us := RingAreaSizes(size)
	var err error
	// Two spare bytes after avail and used let the 16-bit event fields be
	// written and read as aligned 32-bit atomics.
	if r.descGPA, err = mem.Alloc(ds, 16); err != nil {
		return nil, fmt.Errorf("ring %d desc table: %w", index, err)
	}
	if r.availGPA, err = mem.Alloc(as+2, 4); err != nil {
		return nil, fmt.Errorf("ring %d avail ring: %w", index, err)
	}
	if r.usedGPA, err = mem.Alloc(us+2, 4); err != nil {
		return nil, fmt.Errorf("ring %d used ring: %w", index, err)
	}
	if r.desc, err = mem.Slice(r.descGPA, ds); err != nil {
		return nil, err
	}
	if r.avail, err = mem.Slice(r.availGPA, as+2); err != nil {
		return nil, err
	}
	if r.used, err = mem.Slice(r.usedGPA, us+2); err != nil {
		return nil, err
	}
	clear(r.desc)
	clear(r.avail)
	clear(r.used)
	r.chains = make([]*chain, size)
	r.free = make([]uint16, 0, size)
	for i := int(size) - 1; i >= 0; i-- {
		r.free = append(r.free, uint16(i))
	}
	if !pollKick {
		if r.kick, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
			return nil, fmt.Errorf("ring %d kick eventfd: %w", index, err)
		}
	}
	if !pollCall {
		if r.call, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
			r.closeFDs()
			return nil, fmt.Errorf("ring %d call eventfd: %w", index, err)
		}
	} else {
		r.availFlags = AvailFNoInterrupt
		r.storeAvailWord()
	}
	return r, nil
}

func (r *Ring) closeFDs() {
	if r.kick >= 0 {
		unix.Close(r.kick)
		r.kick = -1
	}
	if r.call >= 0 {
		unix.Close(r.call)
		r.call = -1
	}
}

// Size is the number of descriptors.
func (r *Ring) Size() uint16 { return r.size }

// KickFD is the eventfd the driver writes to notify the device (-1: polling).
func (r *Ring) KickFD() int { return r.kick }

// CallFD is the eventfd the device signals (-1: polling).
func (r *Ring) CallFD() int { return r.call }

// GPAs returns the guest-physical addresses of the three ring areas.
func (r *Ring) GPAs() (desc, avail, used uint64) { return r.descGPA, r.availGPA, r.usedGPA }

// Addr returns the SET_VRING_ADDR payload (front-end virtual addresses).
func (r *Ring) Addr() (VringAddr, error) {
	d, err := r.mem.UserAddr(r.descGPA)
	if err != nil {
		return VringAddr{}, err
	}
	a, err := r.mem.UserAddr(r.availGPA)
	if err != nil {
		return VringAddr{}, err
	}
	u, err := r.mem.UserAddr(r.usedGPA)
	if err != nil {
		return VringAddr{}, err
	}
	return VringAddr{Index: uint32(r.Index), Desc: d, Avail: a, Used: u}, nil
}

// NumFree is the number of unused descriptors.
func (r *Ring) NumFree() int { return len(r.free) }

// Outstanding is the number of chains made available and not yet used.
func (r *Ring) Outstanding() int {
	n := 0
	for _, c := range r.chains {
		if c != nil {
			n++
		}
	}
	return n
}

func u32at(b []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }

func (r *Ring) storeAvailWord() {
	atomic.StoreUint32(u32at(r.avail, 0), uint32(r.availFlags)|uint32(r.published)<<16)
}

// UsedIdx loads used.idx.
func (r *Ring) UsedIdx() uint16 { return uint16(atomic.LoadUint32(u32at(r.used, 0)) >> 16) }

// UsedFlags loads used.flags.
func (r *Ring) UsedFlags() uint16 { return uint16(atomic.LoadUint32(u32at(r.used, 0))) }

// AvailEvent loads avail_event (meaningful with EVENT_IDX).
func (r *Ring) AvailEvent() uint16 {
	return uint16(atomic.LoadUint32(u32at(r.used, 4+8*int(r.size))))
}

// AvailIdx returns the published avail.idx.
func (r *Ring) AvailIdx() uint16 { return uint16(atomic.LoadUint32(u32at(r.avail, 0)) >> 16) }

// LastUsed is the next used index the driver will consume.
func (r *Ring) LastUsed() uint16 { return r.lastUsed }

func (r *Ring) setUsedEvent(v uint16) {
	atomic.StoreUint32(u32at(r.avail, 4+2*int(r.size)), uint32(v))
}

// NeedEvent is the EVENT_IDX rule: notify when the event index lies in
// (old, new], computed modulo 2^16.
func NeedEvent(event, newIdx, old uint16) bool {
	return newIdx-event-1 < newIdx-old
}

func (r *Ring) writeDesc(table []byte, i uint16, d Desc) {
	b := table[int(i)*DescSize:]
	binary.LittleEndian.PutUint64(b[0:], d.Addr)
	binary.LittleEndian.PutUint32(b[8:], d.Len)
	binary.LittleEndian.PutUint16(b[12:], d.Flags)
	binary.LittleEndian.PutUint16(b[14:], d.Next)
}

// AddChain puts bufs in free descriptors (or in a fresh indirect table when
// indirect is set) and appends the head to the avail ring, unpublished until
// Publish. The caller owns the buffers' memory.
func (r *Ring) AddChain(bufs []Buffer, indirect bool) (uint16, error) {
	return r.addChain(bufs, indirect, nil)
}

func (r *Ring) addChain(bufs []Buffer, indirect bool, allocs []extent) (uint16, error) {
	if len(bufs) == 0 {
		return 0, errors.New("add chain: no buffers")
	}
	c := &chain{bufs: bufs, allocs: allocs}
	if indirect {
		if len(r.free) == 0 {
			return 0, ErrRingFull
		}
		n := uint64(len(bufs)) * DescSize
		gpa, err := r.mem.Alloc(n, 16)
		if err != nil {
			return 0, fmt.Errorf("indirect table: %w", err)
		}
		table, err := r.mem.Slice(gpa, n)
		if err != nil {
			r.mem.Free(gpa, n)
			return 0, err
		}
		for i, b := range bufs {
			d := Desc{Addr: b.GPA, Len: b.Len}
			if b.Write {
				d.Flags |= DescFWrite
			}
			if i+1 < len(bufs) {
				d.Flags |= DescFNext
				d.Next = uint16(i + 1)
			}
			r.writeDesc(table, uint16(i), d)
		}
		c.allocs = append(c.allocs, extent{gpa, gpa + n})
		head := r.takeFree()
		r.writeDesc(r.desc, head, Desc{Addr: gpa, Len: uint32(n), Flags: DescFIndirect})
		c.descs = []uint16{head}
		return r.enqueue(head, c), nil
	}
	if len(bufs) > len(r.free) {
		return 0, ErrRingFull
	}
	c.descs = make([]uint16, len(bufs))
	for i := range bufs {
		c.descs[i] = r.takeFree()
	}
	for i, b := range bufs {
		d := Desc{Addr: b.GPA, Len: b.Len}
		if b.Write {
			d.Flags |= DescFWrite
		}
		if i+1 < len(bufs) {
			d.Flags |= DescFNext
			d.Next = c.descs[i+1]
		}
		r.writeDesc(r.desc, c.descs[i], d)
	}
	return r.enqueue(c.descs[0], c), nil
}

func (r *Ring) takeFree() uint16 {
	i := r.free[len(r.free)-1]
	r.free = r.free[:len(r.free)-1]
	return i
}

func (r *Ring) enqueue(head uint16, c *chain) uint16 {
	r.chains[head] = c
	binary.LittleEndian.PutUint16(r.avail[4+2*int(r.availIdx%r.size):], head)
	r.availIdx++
	return head
}

// Publish stores avail.idx for every chain added since the last Publish and
// kicks the device unless it asked not to be (NO_NOTIFY, or avail_event with
// EVENT_IDX). It reports whether it kicked.
func (r *Ring) Publish() (bool, error) {
	old := r.published
	if old == r.availIdx {
		return false, nil
	}
	r.published = r.availIdx
	// The atomic store orders the descriptor and ring-entry writes before
	// the index, and the load of the device's suppression state after it.
	r.storeAvailWord()
	var need bool
	if r.eventIdx {
		need = NeedEvent(r.AvailEvent(), r.published, old)
	} else {
		need = r.UsedFlags()&UsedFNoNotify == 0
	}
	if !need {
		r.KicksSuppressed++
		return false, nil
	}
	return true, r.Kick()
}

// Kick writes the kick eventfd unconditionally.
func (r *Ring) Kick() error {
	if r.kick < 0 {
		return nil
	}
	r.Kicks++
	var one [8]byte
	binary.LittleEndian.PutUint64(one[:], 1)
	if _, err := unix.Write(r.kick, one[:]); err != nil && err != unix.EAGAIN {
		return fmt.Errorf("kick ring %d: %w", r.Index, err)
	}
	return nil
}

// PopUsed takes the next used element, if any, checking that the device
// returned a head the driver actually made available.
func (r *Ring) PopUsed() (Used, bool, error) {
	if r.UsedIdx() == r.lastUsed {
		return Used{}, false, nil
	}
	b := r.used[4+8*int(r.lastUsed%r.size):]
	u := Used{ID: binary.LittleEndian.Uint32(b[0:]), Len: binary.LittleEndian.Uint32(b[4:])}
	r.lastUsed++
	if u.ID >= uint32(r.size) || r.chains[u.ID] == nil {
		return u, true, fmt.Errorf("ring %d: device used head %d which is not outstanding", r.Index, u.ID)
	}
	return u, true, nil
}

// PendingUsed is how many used elements the device published and the driver
// has not consumed.
func (r *Ring) PendingUsed() int { return int(r.UsedIdx() - r.lastUsed) }

// release frees a used chain's descriptors and returns its record; the
// caller frees its memory after reading it.
func (r *Ring) release(head uint16) *chain {
	c := r.chains[head]
	r.chains[head] = nil
	if c != nil {
		r.free = append(r.free, c.descs...)
	}
	return c
}

func (r *Ring) freeChain(c *chain) {
	for _, e := range c.allocs {
		r.mem.Free(e.start, e.end-e.start)
	}
}

// Reclaim consumes every pending used element, freeing descriptors and any
// memory the ring allocated for them, and returns the elements.
func (r *Ring) Reclaim() ([]Used, error) {
	var out []Used
	for {
		u, ok, err := r.PopUsed()
		if !ok {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, u)
		r.freeChain(r.release(uint16(u.ID)))
	}
}

// EnableInterrupts asks for a call on the next used element: used_event =
// last used (EVENT_IDX) or NO_INTERRUPT cleared. It reports whether used
// elements are already pending, which the caller must handle before waiting.
func (r *Ring) EnableInterrupts() bool {
	if r.eventIdx {
		r.setUsedEvent(r.lastUsed)
	} else if r.availFlags&AvailFNoInterrupt != 0 {
		r.availFlags &^= AvailFNoInterrupt
		r.storeAvailWord()
	}
	return r.PendingUsed() > 0
}

// DisableInterrupts asks the device not to call (polling).
func (r *Ring) DisableInterrupts() {
	if r.eventIdx {
		// The farthest point from where the device is: it reaches it only
		// after 2^15 more used elements.
		r.setUsedEvent(r.lastUsed + 0x8000)
		return
	}
	r.availFlags |= AvailFNoInterrupt
	r.storeAvailWord()
}

// WaitCall waits until used elements are pending, re-arming interrupts and
// sleeping on the call eventfd (or polling when there is none).
func (r *Ring) WaitCall(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if r.EnableInterrupts() {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("ring %d: %w", r.Index, ErrTimeout)
		}
		if r.call < 0 {
			time.Sleep(min(left, time.Millisecond))
			continue
		}
		ms := int(left / time.Millisecond)
		if ms == 0 {
			ms = 1
		}
		fds := []unix.PollFd{{Fd: int32(r.call), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, ms)
		if err != nil && err != unix.EINTR {
			return fmt.Errorf("poll call fd of ring %d: %w", r.Index, err)
		}
		if n > 0 {
			var b [8]byte
			if _, err := unix.Read(r.call, b[:]); err == nil {
				r.Interrupts++
			}
		}
	}
}

// DrainCall reads the call eventfd counter (non-blocking), returning the
// number of signals coalesced in it.
func (r *Ring) DrainCall() uint64 {
	if r.call < 0 {
		return 0
	}
	var b [8]byte
	if _, err := unix.Read(r.call, b[:]); err != nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b[:])
}

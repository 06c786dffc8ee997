package frontend

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// FixedRing drives a Ring the way a high-speed driver does: every descriptor
// owns one fixed buffer in guest memory for the ring's lifetime and every
// chain is that single descriptor, so posting, publishing and reaping
// allocate nothing and keep no per-chain records. The buffers are returned
// as slices of the shared mapping, so a caller can read(2) straight into a
// TX buffer and write(2) straight out of an RX buffer (no copies).
//
// A FixedRing takes over its Ring: the chain-based methods (AddChain,
// PostRX, SubmitTX, Reclaim...) must not be used on the ring afterwards.
// The ring-level notification methods (EnableInterrupts, DisableInterrupts,
// DrainCall, KickFD, CallFD) stay valid. Not safe for concurrent use.
type FixedRing struct {
	r       *Ring
	bufSize uint32
	flags   uint16
	gpas    []uint64
	bufs    [][]byte
	posted  []uint32 // length posted per descriptor; 0 = not outstanding
	free    []uint16
	out     int
}

// ErrNotFresh means the ring already carries chains of the chain-based API.
var ErrNotFresh = errors.New("ring has outstanding chains")

// Fixed converts a fresh ring (no outstanding chains) into a FixedRing with
// one bufSize-byte buffer per descriptor, device-writable when writable
// (RX) and device-readable otherwise (TX).
func (r *Ring) Fixed(bufSize int, writable bool) (*FixedRing, error) {
	if bufSize <= 0 || bufSize > 1<<30 {
		return nil, fmt.Errorf("fixed ring %d: buffer size %d", r.Index, bufSize)
	}
	if r.Outstanding() != 0 || len(r.free) != int(r.size) {
		return nil, fmt.Errorf("fixed ring %d: %w", r.Index, ErrNotFresh)
	}
	f := &FixedRing{
		r:       r,
		bufSize: uint32(bufSize),
		gpas:    make([]uint64, r.size),
		bufs:    make([][]byte, r.size),
		posted:  make([]uint32, r.size),
		free:    make([]uint16, 0, r.size),
	}
	if writable {
		f.flags = DescFWrite
	}
	for i := range f.gpas {
		gpa, err := r.mem.Alloc(uint64(bufSize), 64)
		if err != nil {
			f.release(i)
			return nil, fmt.Errorf("fixed ring %d buffer %d: %w", r.Index, i, err)
		}
		b, err := r.mem.Slice(gpa, uint64(bufSize))
		if err != nil {
			r.mem.Free(gpa, uint64(bufSize))
			f.release(i)
			return nil, err
		}
		f.gpas[i], f.bufs[i] = gpa, b
	}
	// The chain allocator must never hand these descriptors out again.
	r.free = r.free[:0]
	for i := int(r.size) - 1; i >= 0; i-- {
		f.free = append(f.free, uint16(i))
	}
	return f, nil
}

func (f *FixedRing) release(n int) {
	for i := 0; i < n; i++ {
		f.r.mem.Free(f.gpas[i], uint64(f.bufSize))
	}
}

// Ring returns the underlying ring (for its eventfds and notification
// control).
func (f *FixedRing) Ring() *Ring { return f.r }

// BufSize is the size of every buffer.
func (f *FixedRing) BufSize() int { return int(f.bufSize) }

// Buf returns descriptor id's whole buffer in guest memory.
func (f *FixedRing) Buf(id uint16) []byte { return f.bufs[id%f.r.size] }

// NumFree is the number of descriptors neither posted nor handed out by Get.
func (f *FixedRing) NumFree() int { return len(f.free) }

// Outstanding is the number of descriptors posted and not yet used.
func (f *FixedRing) Outstanding() int { return f.out }

// Get takes a free descriptor for the caller to fill and Post (or Put back).
func (f *FixedRing) Get() (uint16, bool) {
	if len(f.free) == 0 {
		return 0, false
	}
	id := f.free[len(f.free)-1]
	f.free = f.free[:len(f.free)-1]
	return id, true
}

// Put returns a descriptor taken by Get or PopUsed without posting it.
func (f *FixedRing) Put(id uint16) { f.free = append(f.free, id) }

// Post makes descriptor id available with n bytes of its buffer (the frame
// length on TX, the buffer capacity on RX), unpublished until Publish.
func (f *FixedRing) Post(id uint16, n int) {
	r := f.r
	if n <= 0 || n > int(f.bufSize) {
		n = int(f.bufSize)
	}
	d := r.desc[int(id)*DescSize:]
	binary.LittleEndian.PutUint64(d[0:], f.gpas[id])
	binary.LittleEndian.PutUint32(d[8:], uint32(n))
	binary.LittleEndian.PutUint16(d[12:], f.flags)
	binary.LittleEndian.PutUint16(d[14:], 0)
	binary.LittleEndian.PutUint16(r.avail[4+2*int(r.availIdx%r.size):], id)
	r.availIdx++
	f.posted[id] = uint32(n)
	f.out++
}

// Publish stores avail.idx for everything posted since the last Publish and
// kicks the device unless it asked not to be.
func (f *FixedRing) Publish() (bool, error) { return f.r.Publish() }

// PopUsed takes the next used element. The descriptor then belongs to the
// caller again: Post it again or Put it back. A head that was not
// outstanding, or a length beyond the posted one on a writable ring, is an
// error (the device misbehaved); the element is consumed either way.
func (f *FixedRing) PopUsed() (Used, bool, error) {
	r := f.r
	if r.UsedIdx() == r.lastUsed {
		return Used{}, false, nil
	}
	b := r.used[4+8*int(r.lastUsed%r.size):]
	u := Used{ID: binary.LittleEndian.Uint32(b[0:]), Len: binary.LittleEndian.Uint32(b[4:])}
	r.lastUsed++
	if u.ID >= uint32(r.size) || f.posted[u.ID] == 0 {
		return u, true, fmt.Errorf("ring %d: device used head %d which is not outstanding", r.Index, u.ID)
	}
	posted := f.posted[u.ID]
	f.posted[u.ID] = 0
	f.out--
	if f.flags&DescFWrite != 0 && u.Len > posted {
		return u, true, fmt.Errorf("ring %d: device wrote %d bytes into a %d-byte buffer", r.Index, u.Len, posted)
	}
	return u, true, nil
}

package virtqueue

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"

	"golang.org/x/sys/unix"
)

// RegionSpec describes one guest memory region as the front-end announces it
// (SET_MEM_TABLE / ADD_MEM_REG).
type RegionSpec struct {
	GuestAddr  uint64 // guest-physical address of the region start
	Size       uint64
	UserAddr   uint64 // front-end (QEMU) virtual address of the region start
	MmapOffset uint64 // offset into the fd where the region starts (may be unaligned)
}

// guestEnd and userEnd are exclusive; validate guarantees they do not wrap.
func (s RegionSpec) guestEnd() uint64 { return s.GuestAddr + s.Size }
func (s RegionSpec) userEnd() uint64  { return s.UserAddr + s.Size }

func (s RegionSpec) validate() error {
	switch {
	case s.Size == 0:
		return errors.New("empty region")
	case s.Size > math.MaxInt:
		return fmt.Errorf("region size %#x too large", s.Size)
	case s.GuestAddr > math.MaxUint64-s.Size:
		return fmt.Errorf("guest range %#x+%#x wraps", s.GuestAddr, s.Size)
	case s.UserAddr > math.MaxUint64-s.Size:
		return fmt.Errorf("user range %#x+%#x wraps", s.UserAddr, s.Size)
	case s.MmapOffset > math.MaxInt64-s.Size:
		return fmt.Errorf("mmap offset %#x+%#x too large", s.MmapOffset, s.Size)
	}
	return nil
}

// Region is one mapped guest memory region.
type Region struct {
	spec    RegionSpec
	data    []byte // exactly spec.Size bytes, the guest's view from GuestAddr
	mapping []byte // what mmap returned (from the page-aligned offset); nil if not ours

	mu       sync.Mutex
	unmapped bool
}

// MapRegion maps spec.Size bytes of fd at spec.MmapOffset, shared and
// read-write, so that our writes (RX frames, used ring) reach the guest.
// mmap wants a page-aligned offset, and front-ends may hand us an unaligned
// one, so the mapping starts at the aligned-down offset and the region is
// sliced out of it. The fd is not closed: the mapping keeps its own
// reference, and the caller decides the fd's lifetime.
func MapRegion(fd int, spec RegionSpec) (*Region, error) {
	if err := spec.validate(); err != nil {
		return nil, fmt.Errorf("map region at guest %#x: %w", spec.GuestAddr, err)
	}
	page := uint64(os.Getpagesize())
	aligned := spec.MmapOffset &^ (page - 1)
	delta := spec.MmapOffset - aligned
	if spec.Size > math.MaxInt-delta {
		return nil, fmt.Errorf("map region at guest %#x: size %#x too large", spec.GuestAddr, spec.Size)
	}
	if err := CheckSharedFile(fd); err != nil {
		return nil, fmt.Errorf("map region at guest %#x: %w", spec.GuestAddr, err)
	}
	m, err := unix.Mmap(fd, int64(aligned), int(delta+spec.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map region at guest %#x (offset %#x, size %#x): %w", spec.GuestAddr, spec.MmapOffset, spec.Size, err)
	}
	return &Region{spec: spec, data: m[delta : delta+spec.Size : delta+spec.Size], mapping: m}, nil
}

// NewRegion wraps memory the caller already owns (tests, or a mapping made
// elsewhere) as a Region; len(b) must equal spec.Size. Unmap on it only
// forgets b. The caller keeps b alive and unchanged in size.
func NewRegion(spec RegionSpec, b []byte) (*Region, error) {
	if err := spec.validate(); err != nil {
		return nil, fmt.Errorf("region at guest %#x: %w", spec.GuestAddr, err)
	}
	if uint64(len(b)) != spec.Size {
		return nil, fmt.Errorf("region at guest %#x: %d bytes for size %#x", spec.GuestAddr, len(b), spec.Size)
	}
	return &Region{spec: spec, data: b[:len(b):len(b)]}, nil
}

// Spec returns the region's description.
func (r *Region) Spec() RegionSpec { return r.spec }

// Bytes returns the region's memory: exactly Size bytes, starting at
// GuestAddr. It must not be used after Unmap.
func (r *Region) Bytes() []byte { return r.data }

// Unmap releases the mapping. It is idempotent; only the first call can fail.
// The caller must make sure no queue built on a Memory holding r is still
// running: touching unmapped memory faults.
func (r *Region) Unmap() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unmapped {
		return nil
	}
	r.unmapped = true
	m := r.mapping
	r.mapping, r.data = nil, nil
	if m == nil {
		return nil
	}
	if err := unix.Munmap(m); err != nil {
		return fmt.Errorf("unmap region at guest %#x: %w", r.spec.GuestAddr, err)
	}
	return nil
}

// Memory is an immutable snapshot of the memory table; safe for concurrent
// readers. A new table means a new Memory (and new queues built on it).
type Memory struct {
	byGuest []*Region // sorted by GuestAddr, non-overlapping
	byUser  []*Region // sorted by UserAddr, non-overlapping
}

// NewMemory builds a snapshot of regions. Overlapping guest ranges or
// overlapping front-end ranges are rejected: translation must be unambiguous.
// An empty table is valid and translates nothing.
func NewMemory(regions []*Region) (*Memory, error) {
	m := &Memory{
		byGuest: make([]*Region, 0, len(regions)),
		byUser:  make([]*Region, 0, len(regions)),
	}
	for i, r := range regions {
		if r == nil || r.data == nil {
			return nil, fmt.Errorf("memory table: region %d is nil or unmapped", i)
		}
		m.byGuest = append(m.byGuest, r)
		m.byUser = append(m.byUser, r)
	}
	sort.Slice(m.byGuest, func(i, j int) bool { return m.byGuest[i].spec.GuestAddr < m.byGuest[j].spec.GuestAddr })
	sort.Slice(m.byUser, func(i, j int) bool { return m.byUser[i].spec.UserAddr < m.byUser[j].spec.UserAddr })
	for i := 1; i < len(m.byGuest); i++ {
		a, b := m.byGuest[i-1].spec, m.byGuest[i].spec
		if a.guestEnd() > b.GuestAddr {
			return nil, fmt.Errorf("memory table: guest ranges [%#x,%#x) and [%#x,%#x) overlap",
				a.GuestAddr, a.guestEnd(), b.GuestAddr, b.guestEnd())
		}
	}
	for i := 1; i < len(m.byUser); i++ {
		a, b := m.byUser[i-1].spec, m.byUser[i].spec
		if a.userEnd() > b.UserAddr {
			return nil, fmt.Errorf("memory table: user ranges [%#x,%#x) and [%#x,%#x) overlap",
				a.UserAddr, a.userEnd(), b.UserAddr, b.userEnd())
		}
	}
	return m, nil
}

// Regions returns the regions sorted by guest address. The slice is shared:
// do not modify it.
func (m *Memory) Regions() []*Region { return m.byGuest }

// Errors of address translation. They are sentinels so that the data path's
// failure case does not allocate; callers wrap them with the address.
var (
	ErrOutOfMemory = errors.New("address range outside guest memory")
	ErrRangeWraps  = errors.New("address range wraps around")
)

// findGuest returns the region containing guest-physical address gpa, or nil.
func (m *Memory) findGuest(gpa uint64) *Region { return findRegion(m.byGuest, gpa, false) }

// findUser returns the region containing front-end address uva, or nil.
func (m *Memory) findUser(uva uint64) *Region { return findRegion(m.byUser, uva, true) }

// regionStart is where r starts in the front-end's address space (user) or
// the guest's.
func regionStart(r *Region, user bool) uint64 {
	if user {
		return r.spec.UserAddr
	}
	return r.spec.GuestAddr
}

// findRegion returns the region of rs (sorted by the start that user
// selects) containing addr, or nil. Tables are small (a handful of regions,
// at most a few hundred with memory slots): binary search without a closure
// keeps this allocation- and call-free.
func findRegion(rs []*Region, addr uint64, user bool) *Region {
	lo, hi := 0, len(rs)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if regionStart(rs[mid], user) <= addr {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return nil
	}
	r := rs[lo-1]
	if addr-regionStart(r, user) >= r.spec.Size {
		return nil
	}
	return r
}

// guestSlice is GuestSlice returning a sentinel error (no allocation).
func (m *Memory) guestSlice(gpa, n uint64) ([]byte, error) {
	r := m.findGuest(gpa)
	if r == nil {
		return nil, ErrOutOfMemory
	}
	off := gpa - r.spec.GuestAddr // < Size
	// Comparing against the room left avoids computing gpa+n, which a
	// hostile length can wrap.
	if n > r.spec.Size-off {
		return nil, ErrOutOfMemory
	}
	return r.data[off : off+n : off+n], nil
}

// GuestSlice returns the n bytes at guest-physical address gpa. The whole
// range must lie in one region; the slice's capacity ends with the range.
// n == 0 still requires gpa to be inside a region.
func (m *Memory) GuestSlice(gpa, n uint64) ([]byte, error) {
	b, err := m.guestSlice(gpa, n)
	if err != nil {
		return nil, fmt.Errorf("guest range %#x+%#x: %w", gpa, n, err)
	}
	return b, nil
}

// UserSlice returns the n bytes at front-end virtual address uva (ring
// addresses from SET_VRING_ADDR), with GuestSlice's rules.
func (m *Memory) UserSlice(uva, n uint64) ([]byte, error) {
	r := m.findUser(uva)
	if r == nil {
		return nil, fmt.Errorf("user range %#x+%#x: %w", uva, n, ErrOutOfMemory)
	}
	off := uva - r.spec.UserAddr
	if n > r.spec.Size-off {
		return nil, fmt.Errorf("user range %#x+%#x: %w", uva, n, ErrOutOfMemory)
	}
	return r.data[off : off+n : off+n], nil
}

// UserToGuest translates a front-end virtual address to guest-physical.
func (m *Memory) UserToGuest(uva uint64) (uint64, bool) {
	r := m.findUser(uva)
	if r == nil {
		return 0, false
	}
	return r.spec.GuestAddr + (uva - r.spec.UserAddr), true
}

// appendGuest appends the slices covering [gpa, gpa+n) to dst, one per
// region crossed, and refuses to grow dst beyond its capacity (limit=true)
// so that the data path never allocates. On error dst is returned with its
// original length.
func (m *Memory) appendGuest(dst [][]byte, gpa, n uint64, limit bool) ([][]byte, error) {
	if n == 0 {
		return dst, nil
	}
	if gpa > math.MaxUint64-(n-1) {
		return dst, ErrRangeWraps
	}
	orig := len(dst)
	for n > 0 {
		r := m.findGuest(gpa)
		if r == nil {
			return dst[:orig], ErrOutOfMemory
		}
		off := gpa - r.spec.GuestAddr
		take := min(n, r.spec.Size-off)
		if limit && len(dst) == cap(dst) {
			return dst[:orig], errTooManySegments
		}
		dst = append(dst, r.data[off:off+take:off+take])
		gpa += take // cannot wrap: checked above
		n -= take
	}
	return dst, nil
}

// AppendGuestIovecs appends slices covering the n bytes at gpa to dst. The
// range may span adjacent regions (guest-physically contiguous, each its own
// mapping), which yields one slice per region. On error dst is returned
// unchanged in length.
func (m *Memory) AppendGuestIovecs(dst [][]byte, gpa, n uint64) ([][]byte, error) {
	out, err := m.appendGuest(dst, gpa, n, false)
	if err != nil {
		return out, fmt.Errorf("guest range %#x+%#x: %w", gpa, n, err)
	}
	return out, nil
}

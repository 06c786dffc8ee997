package frontend

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Layout chooses how guest memory is cut into vhost-user regions.
type Layout int

const (
	// LayoutSingle is one region at guest-physical address 0.
	LayoutSingle Layout = iota
	// LayoutPCHole is QEMU's `pc` layout: [0, 640 KiB) and [768 KiB, size),
	// with a hole between, both backed by one memfd at matching offsets.
	LayoutPCHole
	// LayoutAdjacent is two regions with contiguous guest and user addresses,
	// so a buffer may span the boundary (the back-end must split the iovec).
	LayoutAdjacent
)

const (
	pcLowEnd    = 0xa0000
	pcHighStart = 0xc0000
	pageSize    = 4096
)

// ErrNoMemory means the allocator has no free extent large enough.
var ErrNoMemory = errors.New("guest memory exhausted")

// Memory is the guest's RAM: one memfd mapped once into this process, shown
// to the back-end as one or more regions. The user address of each region is
// its real address in this process, as QEMU does.
//
// Allocation is safe for concurrent use (a receiving and a sending goroutine
// may share one Memory); reads and writes of guest bytes are not locked.
type Memory struct {
	fd      int
	size    uint64   // bytes of the memfd
	maps    [][]byte // every mapping, for Close
	regions []Region
	data    [][]byte // per region: its bytes
	mu      sync.Mutex
	free    [][]extent // per region, sorted, coalesced
}

type extent struct{ start, end uint64 } // guest-physical, end exclusive

// NewMemory creates size bytes of guest memory (rounded up to a page).
func NewMemory(size uint64, layout Layout) (*Memory, error) {
	size = (size + pageSize - 1) &^ (pageSize - 1)
	if layout == LayoutPCHole && size <= pcHighStart+pageSize {
		return nil, fmt.Errorf("pc layout needs more than %d bytes, got %d", pcHighStart+pageSize, size)
	}
	if size < 2*pageSize {
		return nil, fmt.Errorf("guest memory of %d bytes is too small", size)
	}
	fd, err := unix.MemfdCreate("vunet-test-guest", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate guest memory: %w", err)
	}
	buf, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap guest memory: %w", err)
	}
	m := &Memory{fd: fd, size: size, maps: [][]byte{buf}}
	base := uint64(uintptr(unsafe.Pointer(&buf[0])))
	switch layout {
	case LayoutPCHole:
		m.regions = []Region{
			{GuestAddr: 0, Size: pcLowEnd, UserAddr: base, MmapOffset: 0},
			{GuestAddr: pcHighStart, Size: size - pcHighStart, UserAddr: base + pcHighStart, MmapOffset: pcHighStart},
		}
	case LayoutAdjacent:
		half := (size / 2) &^ (pageSize - 1)
		m.regions = []Region{
			{GuestAddr: 0, Size: half, UserAddr: base, MmapOffset: 0},
			{GuestAddr: half, Size: size - half, UserAddr: base + half, MmapOffset: half},
		}
	default:
		m.regions = []Region{{GuestAddr: 0, Size: size, UserAddr: base, MmapOffset: 0}}
	}
	for _, r := range m.regions {
		m.data = append(m.data, buf[r.MmapOffset:r.MmapOffset+r.Size:r.MmapOffset+r.Size])
	}
	for i, r := range m.regions {
		start := r.GuestAddr
		if i == 0 {
			// Guest-physical 0 stays unallocated so a zeroed descriptor never
			// points at a live buffer by accident.
			start += pageSize
		}
		m.free = append(m.free, []extent{{start, r.GuestAddr + r.Size}})
	}
	return m, nil
}

// FD returns the memfd; it stays owned by Memory (the message layer passes
// it by SCM_RIGHTS, which duplicates it).
func (m *Memory) FD() int { return m.fd }

// Regions returns the region table sent to the back-end.
func (m *Memory) Regions() []Region { return append([]Region(nil), m.regions...) }

// Size is the size of the memfd.
func (m *Memory) Size() uint64 { return m.size }

// Grow adds size bytes (rounded up to a page) as a new region above the
// highest guest address, backed by the same memfd at the next offset and
// mapped separately (its own user address), the way memory hot-plug shows
// up. The caller then re-sends the table (RemapMemTable or ADD_MEM_REG).
// Grow must not run concurrently with any other use of m.
func (m *Memory) Grow(size uint64) (Region, error) {
	size = (size + pageSize - 1) &^ (pageSize - 1)
	off := m.size
	if err := unix.Ftruncate(m.fd, int64(off+size)); err != nil {
		return Region{}, fmt.Errorf("grow guest memory: %w", err)
	}
	buf, err := unix.Mmap(m.fd, int64(off), int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return Region{}, fmt.Errorf("map grown guest memory: %w", err)
	}
	var top uint64
	for _, r := range m.regions {
		top = max(top, r.GuestAddr+r.Size)
	}
	// 1 GiB alignment keeps the new region visibly apart, like DIMM slots.
	gpa := (top + (1 << 30) - 1) &^ ((1 << 30) - 1)
	r := Region{GuestAddr: gpa, Size: size, UserAddr: uint64(uintptr(unsafe.Pointer(&buf[0]))), MmapOffset: off}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.size += size
	m.maps = append(m.maps, buf)
	m.regions = append(m.regions, r)
	m.data = append(m.data, buf)
	m.free = append(m.free, []extent{{gpa, gpa + size}})
	return r, nil
}

// Close unmaps the memory and closes the memfd.
func (m *Memory) Close() error {
	var err error
	for _, b := range m.maps {
		if uerr := unix.Munmap(b); err == nil {
			err = uerr
		}
	}
	m.maps, m.data = nil, nil
	if m.fd >= 0 {
		if cerr := unix.Close(m.fd); err == nil {
			err = cerr
		}
		m.fd = -1
	}
	return err
}

func (m *Memory) regionOf(gpa uint64) (int, bool) {
	for i, r := range m.regions {
		if gpa >= r.GuestAddr && gpa-r.GuestAddr < r.Size {
			return i, true
		}
	}
	return 0, false
}

// Slice returns n bytes at gpa; the range must lie inside one region.
func (m *Memory) Slice(gpa, n uint64) ([]byte, error) {
	i, ok := m.regionOf(gpa)
	if !ok {
		return nil, fmt.Errorf("gpa %#x not in guest memory", gpa)
	}
	r := m.regions[i]
	off := gpa - r.GuestAddr
	if n > r.Size-off {
		return nil, fmt.Errorf("gpa %#x+%d crosses the end of region %d", gpa, n, i)
	}
	return m.data[i][off : off+n : off+n], nil
}

// Write copies b to gpa; the range may span adjacent regions.
func (m *Memory) Write(gpa uint64, b []byte) error {
	return m.each(gpa, uint64(len(b)), func(dst []byte, done uint64) { copy(dst, b[done:]) })
}

// Read copies len(b) bytes from gpa; the range may span adjacent regions.
func (m *Memory) Read(gpa uint64, b []byte) error {
	return m.each(gpa, uint64(len(b)), func(src []byte, done uint64) { copy(b[done:], src) })
}

func (m *Memory) each(gpa, n uint64, fn func(part []byte, done uint64)) error {
	var done uint64
	for done < n {
		i, ok := m.regionOf(gpa + done)
		if !ok {
			return fmt.Errorf("gpa %#x not in guest memory", gpa+done)
		}
		r := m.regions[i]
		off := gpa + done - r.GuestAddr
		k := min(r.Size-off, n-done)
		fn(m.data[i][off:off+k], done)
		done += k
	}
	return nil
}

// UserAddr translates a guest-physical address to the front-end virtual
// address the back-end expects in SET_VRING_ADDR.
func (m *Memory) UserAddr(gpa uint64) (uint64, error) {
	i, ok := m.regionOf(gpa)
	if !ok {
		return 0, fmt.Errorf("gpa %#x not in guest memory", gpa)
	}
	r := m.regions[i]
	return r.UserAddr + gpa - r.GuestAddr, nil
}

// Alloc returns size bytes aligned to align (a power of two), inside one
// region, trying the regions in order.
func (m *Memory) Alloc(size, align uint64) (uint64, error) {
	for i := range m.regions {
		if gpa, err := m.AllocIn(i, size, align); err == nil {
			return gpa, nil
		}
	}
	return 0, fmt.Errorf("alloc %d bytes: %w", size, ErrNoMemory)
}

// AllocIn allocates from region i only.
func (m *Memory) AllocIn(i int, size, align uint64) (uint64, error) {
	if size == 0 {
		size = 1
	}
	if align == 0 {
		align = 1
	}
	if align&(align-1) != 0 {
		return 0, fmt.Errorf("alloc: alignment %d is not a power of two", align)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if i < 0 || i >= len(m.free) {
		return 0, fmt.Errorf("alloc: no region %d", i)
	}
	ext := m.free[i]
	for k, e := range ext {
		start := (e.start + align - 1) &^ (align - 1)
		if start < e.start || start >= e.end || e.end-start < size {
			continue
		}
		end := start + size
		var repl []extent
		if start > e.start {
			repl = append(repl, extent{e.start, start})
		}
		if end < e.end {
			repl = append(repl, extent{end, e.end})
		}
		m.free[i] = append(ext[:k:k], append(repl, ext[k+1:]...)...)
		return start, nil
	}
	return 0, fmt.Errorf("alloc %d bytes in region %d: %w", size, i, ErrNoMemory)
}

// Free returns an allocation; size must be the size passed to Alloc.
func (m *Memory) Free(gpa, size uint64) {
	if size == 0 {
		size = 1
	}
	i, ok := m.regionOf(gpa)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ext := append(m.free[i], extent{gpa, gpa + size})
	sort.Slice(ext, func(a, b int) bool { return ext[a].start < ext[b].start })
	out := ext[:1]
	for _, e := range ext[1:] {
		last := &out[len(out)-1]
		if e.start <= last.end {
			last.end = max(last.end, e.end)
			continue
		}
		out = append(out, e)
	}
	m.free[i] = out
}

// FreeBytes reports the bytes still available to Alloc (for leak checks).
func (m *Memory) FreeBytes() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n uint64
	for _, ext := range m.free {
		for _, e := range ext {
			n += e.end - e.start
		}
	}
	return n
}

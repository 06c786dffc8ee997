package vqtest

import (
	"errors"
	"fmt"

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
	return newGuestMemory("vqtest-guest", true, specs)
}

// NewFrontendMemory creates guest memory as a vhost-user front-end does: a
// memfd named name, mapped once, for the driver. The device maps it itself
// from the descriptor it is sent (FD); Memory returns nil.
func NewFrontendMemory(name string, specs ...virtqueue.RegionSpec) (*GuestMemory, error) {
	return newGuestMemory(name, false, specs)
}

func newGuestMemory(name string, deviceView bool, specs []virtqueue.RegionSpec) (*GuestMemory, error) {
	var end uint64
	for _, s := range specs {
		end = max(end, s.MmapOffset+s.Size)
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
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
	if !deviceView {
		return g, nil
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

// Memory returns the device's view (nil for NewFrontendMemory).
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

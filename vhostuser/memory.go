package vhostuser

import (
	"fmt"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
)

// memSlot is one mapped region of the memory table. refs counts the
// ADD_MEM_REGs that announced it: QEMU with queues=N sends every region
// once per queue pair (same region, new fd), and removes it as many times.
type memSlot struct {
	region *virtqueue.Region
	refs   int
}

func specOf(r MemRegion) virtqueue.RegionSpec {
	return virtqueue.RegionSpec{GuestAddr: r.GuestAddr, Size: r.Size, UserAddr: r.UserAddr, MmapOffset: r.MmapOffset}
}

// sameRegion compares what identifies a region for REM_MEM_REG and for
// deduplication: guest address, size and user address (not the offset).
func sameRegion(a, b virtqueue.RegionSpec) bool {
	return a.GuestAddr == b.GuestAddr && a.Size == b.Size && a.UserAddr == b.UserAddr
}

func regionsOf(slots []memSlot) []*virtqueue.Region {
	rs := make([]*virtqueue.Region, len(slots))
	for i := range slots {
		rs[i] = slots[i].region
	}
	return rs
}

// mappedSize is the total size of the regions in slots.
func mappedSize(slots []memSlot) uint64 {
	var n uint64
	for i := range slots {
		n += slots[i].region.Spec().Size
	}
	return n
}

// checkMemoryLimit refuses a memory table of total bytes (already mapped
// plus asked for) past the device's cap. Sizes are summed by the caller
// with overflow saturating at the maximum, so a wrap cannot pass.
func (d *device) checkMemoryLimit(total uint64) error {
	if total <= d.maxMem {
		return nil
	}
	return fmt.Errorf("%d bytes of guest memory would be mapped, more than the limit of %d (--max-guest-memory): %w",
		total, d.maxMem, errMemoryLimit)
}

// addSize adds b to a, saturating at the maximum uint64.
func addSize(a, b uint64) uint64 {
	if a > ^uint64(0)-b {
		return ^uint64(0)
	}
	return a + b
}

// unmapSlots unmaps the regions in slots, or keeps them mapped once a pair
// was abandoned (its loop may still touch any of them).
func (d *device) unmapSlots(slots []memSlot) {
	if d.gone != nil {
		d.gone.slots = append(d.gone.slots, slots...)
		return
	}
	for i := range slots {
		if err := slots[i].region.Unmap(); err != nil {
			d.log.Warn("unmap guest memory", "err", err)
		}
	}
}

// swapMemory installs a new memory table under the data plane: running
// pairs are stopped (so nothing touches the old mappings), the table
// replaced, ready pairs restarted with queues translated against the new
// table, and only then (or when a fault unwinds the restart) are the
// regions in unmap released. A ring whose
// addresses are no longer mapped stays stopped and is reported in the log;
// the memory change itself stands.
func (d *device) swapMemory(mem *virtqueue.Memory, slots []memSlot, unmap []memSlot) {
	d.stopAll()
	d.mem, d.slots = mem, slots
	d.stats.GuestMemory.Store(mappedSize(slots))
	// Deferred: building a queue on the new table can fault (a front-end
	// shrinking the file), which unwinds through here to process; the old
	// regions, no longer in d.slots, would leak.
	defer d.unmapSlots(unmap)
	if err := d.startAll(); err != nil {
		d.stats.countError(classify(err))
		d.log.Error("queue pair not restarted after memory table change", "err", err)
	}
	for _, s := range slots {
		spec := s.region.Spec()
		d.log.Debug("guest memory region", "guest_addr", fmt.Sprintf("%#x", spec.GuestAddr),
			"size", spec.Size, "user_addr", fmt.Sprintf("%#x", spec.UserAddr), "refs", s.refs)
	}
}

// mapRegion maps one region after checking that the file really backs it:
// mmap accepts a range beyond the end of a file, and the first touch of
// such a page is a SIGBUS, which would kill the daemon.
func mapRegion(fd int, r MemRegion) (*virtqueue.Region, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("region fd: %w", err)
	}
	// memfd, tmpfs and hugetlbfs files are regular files with a size;
	// anything else (a device) has no size to check against.
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		size := uint64(st.Size)
		if r.MmapOffset > size || r.Size > size-r.MmapOffset {
			return nil, fmt.Errorf("region at guest %#x: offset %#x + size %#x beyond the %d-byte file: %w",
				r.GuestAddr, r.MmapOffset, r.Size, size, ErrInvalid)
		}
	}
	return virtqueue.MapRegion(fd, specOf(r))
}

// setMemTable replaces the whole memory table (SET_MEM_TABLE). DPDK sends
// it again, grown, after the rings are set up.
func (d *device) setMemTable(m *Message) error {
	regions, err := DecodeMemTable(m.Payload)
	if err != nil {
		return err
	}
	// Checked before anything is mapped; the old table is unmapped once
	// the new one is in place, so only the new one counts.
	var total uint64
	for _, r := range regions {
		total = addSize(total, r.Size)
	}
	if err := d.checkMemoryLimit(total); err != nil {
		return fmt.Errorf("mem table: %w", err)
	}
	slots := make([]memSlot, 0, len(regions))
	for i, r := range regions {
		reg, err := mapRegion(m.FDs[i], r)
		if err != nil {
			d.unmapSlots(slots)
			return fmt.Errorf("mem table region %d: %w: %w", i, errMemory, err)
		}
		slots = append(slots, memSlot{region: reg, refs: 1})
	}
	// The mappings hold their own references; m's fds are closed by process.
	mem, err := virtqueue.NewMemory(regionsOf(slots))
	if err != nil {
		d.unmapSlots(slots)
		return fmt.Errorf("mem table: %w: %w", errMemory, err)
	}
	if len(regions) == 0 {
		d.warnNoMemory()
	}
	d.swapMemory(mem, slots, d.slots)
	d.log.Info("guest memory table set", "regions", len(slots))
	return nil
}

// addMemReg adds one region (ADD_MEM_REG, CONFIGURE_MEM_SLOTS).
func (d *device) addMemReg(m *Message) error {
	r, err := DecodeMemRegMsg(m.Payload)
	if err != nil {
		return err
	}
	spec := specOf(r)
	for i := range d.slots {
		if sameRegion(d.slots[i].region.Spec(), spec) {
			d.slots[i].refs++
			return nil // the duplicate fd is closed by process
		}
	}
	if len(d.slots) >= MaxMemSlots {
		return fmt.Errorf("add mem region: all %d slots used: %w", MaxMemSlots, ErrInvalid)
	}
	if err := d.checkMemoryLimit(addSize(mappedSize(d.slots), r.Size)); err != nil {
		return fmt.Errorf("add mem region at guest %#x: %w", r.GuestAddr, err)
	}
	reg, err := mapRegion(m.FDs[0], r)
	if err != nil {
		return fmt.Errorf("add mem region: %w: %w", errMemory, err)
	}
	slots := append(append(make([]memSlot, 0, len(d.slots)+1), d.slots...), memSlot{region: reg, refs: 1})
	mem, err := virtqueue.NewMemory(regionsOf(slots))
	if err != nil {
		reg.Unmap()
		return fmt.Errorf("add mem region: %w: %w", errMemory, err)
	}
	d.swapMemory(mem, slots, nil)
	return nil
}

// remMemReg drops one reference to a region (REM_MEM_REG) and unmaps it
// when the last one goes.
func (d *device) remMemReg(m *Message) error {
	r, err := DecodeMemRegMsg(m.Payload)
	if err != nil {
		return err
	}
	spec := specOf(r)
	idx := -1
	for i := range d.slots {
		if sameRegion(d.slots[i].region.Spec(), spec) {
			idx = i
			break
		}
	}
	if idx < 0 {
		return fmt.Errorf("remove mem region guest %#x size %#x: not mapped: %w", spec.GuestAddr, spec.Size, ErrInvalid)
	}
	if d.slots[idx].refs > 1 {
		d.slots[idx].refs--
		return nil
	}
	slots := make([]memSlot, 0, len(d.slots)-1)
	slots = append(append(slots, d.slots[:idx]...), d.slots[idx+1:]...)
	mem, err := virtqueue.NewMemory(regionsOf(slots))
	if err != nil {
		return fmt.Errorf("remove mem region: %w: %w", errMemory, err)
	}
	d.swapMemory(mem, slots, []memSlot{d.slots[idx]})
	return nil
}

package frontend

import (
	"encoding/binary"
	"time"
)

// The methods in this file bypass the driver's bookkeeping so hostile tests
// can write what no correct driver would: loops, wild addresses, avail
// indices running ahead. A ring used this way should be thrown away after.

// SetDesc writes descriptor i of the ring's table.
func (r *Ring) SetDesc(i uint16, d Desc) { r.writeDesc(r.desc, i%r.size, d) }

// ReadDesc reads descriptor i of the ring's table.
func (r *Ring) ReadDesc(i uint16) Desc {
	b := r.desc[int(i%r.size)*DescSize:]
	return Desc{
		Addr:  binary.LittleEndian.Uint64(b[0:]),
		Len:   binary.LittleEndian.Uint32(b[8:]),
		Flags: binary.LittleEndian.Uint16(b[12:]),
		Next:  binary.LittleEndian.Uint16(b[14:]),
	}
}

// WriteDescTable writes descs as a descriptor table at gpa (for indirect
// tables the test builds itself).
func (r *Ring) WriteDescTable(gpa uint64, descs []Desc) error {
	b := make([]byte, len(descs)*DescSize)
	for i, d := range descs {
		r.writeDesc(b, uint16(i), d)
	}
	return r.mem.Write(gpa, b)
}

// SetAvailEntry writes avail.ring[slot % size] = head.
func (r *Ring) SetAvailEntry(slot, head uint16) {
	binary.LittleEndian.PutUint16(r.avail[4+2*int(slot%r.size):], head)
}

// SetAvailIdx publishes an arbitrary avail.idx (and makes it the driver's
// shadow index too).
func (r *Ring) SetAvailIdx(idx uint16) {
	r.availIdx, r.published = idx, idx
	r.storeAvailWord()
}

// SetAvailFlags sets avail.flags.
func (r *Ring) SetAvailFlags(flags uint16) {
	r.availFlags = flags
	r.storeAvailWord()
}

// SetUsedEvent writes used_event (EVENT_IDX).
func (r *Ring) SetUsedEvent(v uint16) { r.setUsedEvent(v) }

// PushRawHead appends head to the avail ring at the current index and
// publishes it with a kick, with no descriptor bookkeeping: the descriptors
// are whatever SetDesc wrote.
func (r *Ring) PushRawHead(head uint16) error {
	r.SetAvailEntry(r.availIdx, head)
	r.SetAvailIdx(r.availIdx + 1)
	return r.Kick()
}

// UsedElem reads used.ring[slot % size] without consuming it.
func (r *Ring) UsedElem(slot uint16) Used {
	b := r.used[4+8*int(slot%r.size):]
	return Used{ID: binary.LittleEndian.Uint32(b[0:]), Len: binary.LittleEndian.Uint32(b[4:])}
}

// SkipUsed consumes n used elements without interpreting them (after raw
// pushes the driver has no chain record for).
func (r *Ring) SkipUsed(n uint16) { r.lastUsed += n }

// WaitUsedIdx waits until used.idx reaches want (modulo 2^16 distance).
func (r *Ring) WaitUsedIdx(want uint16, timeout time.Duration) error {
	return waitUntil(timeout, func() bool { return int16(r.UsedIdx()-want) >= 0 })
}

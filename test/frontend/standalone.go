package frontend

import (
	"encoding/binary"
	"sync/atomic"
)

// NewRing creates a driver ring in mem with its own kick and call eventfds,
// outside any Frontend: for harnesses that play the device side themselves
// (the rig's bridge tests). Close releases the eventfds.
func NewRing(mem *Memory, index int, size uint16, eventIdx bool) (*Ring, error) {
	return newRing(mem, index, size, eventIdx, false, false)
}

// Close closes the ring's eventfds (rings made by NewRing; a Frontend closes
// its own).
func (r *Ring) Close() { r.closeFDs() }

// The Device* methods are the device's side of the ring, for harnesses that
// stand in for a back-end. They follow the split-ring layout directly and
// share no state with the driver's bookkeeping.

// DeviceAvailEntry reads avail.ring[slot % size].
func (r *Ring) DeviceAvailEntry(slot uint16) uint16 {
	return binary.LittleEndian.Uint16(r.avail[4+2*int(slot%r.size):])
}

// DevicePushUsed appends one used element and publishes it (used.idx + 1).
func (r *Ring) DevicePushUsed(head uint16, n uint32) {
	w := atomic.LoadUint32(u32at(r.used, 0))
	idx := uint16(w >> 16)
	e := r.used[4+8*int(idx%r.size):]
	binary.LittleEndian.PutUint32(e[0:], uint32(head))
	binary.LittleEndian.PutUint32(e[4:], n)
	atomic.StoreUint32(u32at(r.used, 0), w&0xffff|uint32(idx+1)<<16)
}

package vqtest

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
)

// Ring is one split virtqueue as a front-end and the control plane set it
// up: the guest's Driver, the kick and call eventfds, and the device's
// SplitQueue over the same memory (Rebuild makes a new one, as the control
// plane does on every restart of a queue pair).
type Ring struct {
	*Driver
	// EventIdx: VIRTIO_RING_F_EVENT_IDX was negotiated; Send and the
	// device's queue follow its notification rules.
	EventIdx bool
	// Kick and Call are the eventfds: the driver writes Kick, the device
	// signals Call.
	Kick, Call int
	// Q is the device's side, built by Rebuild.
	Q *virtqueue.SplitQueue
	// Stats are the device queue's counters.
	Stats virtqueue.Stats
}

// NewRing lays out a Driver (see NewDriver) and opens its eventfds. Close
// closes them.
func NewRing(g *GuestMemory, size uint16, ringGPA, dataGPA, dataSize uint64, eventIdx bool) (*Ring, error) {
	r := &Ring{Driver: NewDriver(g, size, ringGPA, dataGPA, dataSize), EventIdx: eventIdx, Kick: -1, Call: -1}
	var err error
	if r.Kick, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("kick eventfd: %w", err)
	}
	if r.Call, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		unix.Close(r.Kick)
		return nil, fmt.Errorf("call eventfd: %w", err)
	}
	return r, nil
}

// Close closes the eventfds.
func (r *Ring) Close() {
	unix.Close(r.Kick)
	unix.Close(r.Call)
}

// QueueConfig is the device queue's configuration for ring index index,
// continuing at lastAvail: this ring's addresses, eventfds, memory and
// counters, indirect descriptors on. A test changes what it needs (Kick
// -1 for a polling front-end, an error eventfd, a logger) and passes it to
// Rebuild.
func (r *Ring) QueueConfig(index int, lastAvail uint16) virtqueue.Config {
	c := r.Config(r.EventIdx, true)
	c.Index, c.LastAvail = index, lastAvail
	c.Kick, c.Call = r.Kick, r.Call
	c.Stats = &r.Stats
	return c
}

// Rebuild makes a new device queue from cfg (see QueueConfig).
func (r *Ring) Rebuild(cfg virtqueue.Config) error {
	q, err := virtqueue.NewSplitQueue(cfg)
	if err != nil {
		return err
	}
	r.Q = q
	return nil
}

// Send publishes what was placed and kicks when the device asked for it,
// as a Linux driver does.
func (r *Ring) Send() {
	if r.Publish(r.EventIdx) {
		r.KickNow()
	}
}

// KickNow kicks the device whatever it asked for.
func (r *Ring) KickNow() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(r.Kick, one[:])
}

// Calls reads and resets the call eventfd's counter: how often the device
// signalled since the last read (0 for none).
func (r *Ring) Calls() uint64 {
	var b [8]byte
	n, err := unix.Read(r.Call, b[:])
	if err != nil || n != 8 {
		return 0
	}
	return binary.NativeEndian.Uint64(b[:])
}

// Post publishes what was placed without kicking: for a device that polls,
// or a test that kicks (KickNow) or starts the device itself.
func (r *Ring) Post() { r.Publish(r.EventIdx) }

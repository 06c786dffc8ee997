package vhostuser

import (
	"fmt"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
)

// vring is the control plane's view of one ring. The ring is "started" once
// SET_VRING_KICK arrived (until GET_VRING_BASE), and runs when it is started,
// sized, addressed, and its partner ring in the pair is too.
type vring struct {
	num       uint16 // 0: SET_VRING_NUM not received
	addr      virtqueue.Addresses
	addrSet   bool
	addrFlags uint32
	logAddr   uint64 // used ring's guest-physical address for dirty logging
	base      uint16 // next avail index: SET_VRING_BASE, or saved when the queue stopped
	kick      int    // -1: none (also when polling)
	call      int
	errFD     int
	started   bool // SET_VRING_KICK received since the last stop
	enabled   bool // last SET_VRING_ENABLE value
	freshCall bool // call fd replaced since the pair last started: signal it once
	q         *virtqueue.SplitQueue
}

func (r *vring) reset() {
	*r = vring{kick: -1, call: -1, errFD: -1}
}

func (r *vring) closeFDs() {
	for _, fd := range []*int{&r.kick, &r.call, &r.errFD} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

func (r *vring) ready() bool { return r.started && r.num != 0 && r.addrSet }

// checkRing validates a ring index from a message.
func (d *device) checkRing(idx uint32) (int, error) {
	if idx >= uint32(len(d.rings)) {
		return 0, fmt.Errorf("vring %d: only %d rings: %w", idx, len(d.rings), ErrInvalid)
	}
	return int(idx), nil
}

// enabled reports the effective enable state: without PROTOCOL_FEATURES a
// ring is enabled as soon as it starts (spec, "Ring states").
func (d *device) enabled(r *vring) bool {
	return r.enabled || d.features&FeatureProtocolFeatures == 0
}

// stopPair stops pair p if the data plane runs it and saves the rings'
// positions so a rebuilt queue continues where this one stopped.
func (d *device) stopPair(p int) bool {
	if !d.running[p] {
		return false
	}
	stopped := d.stopPairTimed(p)
	d.running[p] = false
	if !stopped {
		return true // abandoned: the rings are the loop's (stop_deadline.go)
	}
	var used [2]uint16
	for i := 2 * p; i <= 2*p+1; i++ {
		r := &d.rings[i]
		if r.q != nil {
			r.base = r.q.LastAvail()
			used[i-2*p] = r.q.UsedIndex()
			if n := r.q.Staged(); n != 0 {
				// Elements pushed and never published: their chains are
				// lost to the guest, and a later queue's used.idx would
				// not match the chains it was given.
				d.stats.countError(ErrReasonDataPlane)
				d.log.Error("vring stopped with used elements unpublished", "vring", i, "staged", n)
			}
			r.q = nil
		}
	}
	d.log.Debug("queue pair stopped", "pair", p, "rx_base", d.rings[2*p].base, "rx_used", used[0],
		"tx_base", d.rings[2*p+1].base, "tx_used", used[1])
	return true
}

// stopAll stops every running pair.
func (d *device) stopAll() {
	for p := range d.running {
		d.stopPair(p)
	}
}

// startAll starts every ready pair that is not running, returning the first
// error; a pair that fails stays stopped while the others start.
func (d *device) startAll() error {
	var first error
	for p := range d.running {
		if err := d.startPair(p); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// startPair hands pair p to the data plane if both its rings are ready. It
// is a no-op for a pair that is not ready or already running.
func (d *device) startPair(p int) error {
	if d.running[p] {
		return nil
	}
	if d.gone != nil {
		return nil // a pair was abandoned: the session is ending
	}
	rx, tx := &d.rings[2*p], &d.rings[2*p+1]
	if !rx.ready() || !tx.ready() {
		return nil
	}
	if len(d.mem.Regions()) == 0 {
		d.warnNoMemory()
		d.stats.countError(ErrReasonMemory)
		return fmt.Errorf("start pair %d: no guest memory regions: %w", p, errMemory)
	}
	if d.stuck.stuck(p) {
		// Not this front-end's fault: the message stands, the pair stays
		// stopped (its other pairs run), loudly.
		d.stats.countError(ErrReasonDataPlane)
		d.warn("queue pair not started: an earlier session abandoned it and its data plane has not stopped yet", "pair", p)
		return nil
	}
	rxq, err := d.newQueue(2 * p)
	if err != nil {
		return err
	}
	txq, err := d.newQueue(2*p + 1)
	if err != nil {
		return err
	}
	// Signal before the data plane owns the queues: Signal is not safe
	// concurrently with the pair's event loop.
	for i, q := range []*virtqueue.SplitQueue{rxq, txq} {
		r := &d.rings[2*p+i]
		if r.freshCall {
			if err := q.Signal(); err != nil {
				d.log.Warn("signal new call fd", "vring", 2*p+i, "err", err)
			}
			r.freshCall = false
		}
	}
	qp := virtqueue.QueuePair{
		Index:     p,
		RX:        rxq,
		TX:        txq,
		RXEnabled: d.enabled(rx),
		TXEnabled: d.enabled(tx),
		Features:  d.features,
		ControlFD: d.control,
	}
	// Read before the data plane owns the queues: what the guest sees
	// of the used rings as the pair starts.
	rxUsed, txUsed := rxq.UsedIndex(), txq.UsedIndex()
	if err := d.dp.StartPair(qp); err != nil {
		return fmt.Errorf("start pair %d: %w: %w", p, errDataPlane, err)
	}
	rx.q, tx.q = rxq, txq
	d.running[p] = true
	d.migrationStopped = false
	d.log.Info("queue pair started", "pair", p, "rx_size", rx.num, "tx_size", tx.num,
		"rx_enabled", qp.RXEnabled, "tx_enabled", qp.TXEnabled,
		"rx_base", rx.base, "tx_base", tx.base, "rx_used", rxUsed, "tx_used", txUsed)
	return nil
}

func (d *device) newQueue(i int) (*virtqueue.SplitQueue, error) {
	r := &d.rings[i]
	q, err := virtqueue.NewSplitQueue(virtqueue.Config{
		Index:     i,
		Size:      r.num,
		Addr:      r.addr,
		LastAvail: r.base,
		EventIdx:  d.features&(1<<virtqueue.FeatureRingEventIdx) != 0,
		Indirect:  d.features&(1<<virtqueue.FeatureRingIndirectDesc) != 0,
		Kick:      r.kick,
		Call:      r.call,
		Err:       r.errFD,
		Mem:       d.mem,
		Stats:     &d.stats.Rings[i],
		Logger:    d.log,
		Log:       d.ringLogConfig(i),
	})
	if err != nil {
		return nil, fmt.Errorf("build vring %d: %w: %w", i, errDataPlane, err)
	}
	return q, nil
}

// warnNoMemory says loudly why a guest can have no network: QEMU sends no
// memory regions, and no warning, when guest RAM is not shared.
func (d *device) warnNoMemory() {
	d.log.Error("guest memory is not shared with the back-end: the front-end sent no memory regions. " +
		"Give the guest shared memory, e.g. -object memory-backend-memfd,id=mem,size=<RAM>,share=on " +
		"-numa node,memdev=mem (libvirt: <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>)")
}

// withPair stops the pair of ring i, applies change, and starts the pair
// again if it is ready.
func (d *device) withPair(i int, change func(r *vring)) error {
	p := i / 2
	d.stopPair(p)
	change(&d.rings[i])
	return d.startPair(p)
}

func (d *device) setVringNum(s VringState) error {
	i, err := d.checkRing(s.Index)
	if err != nil {
		return err
	}
	if s.Num == 0 || s.Num > virtqueue.MaxQueueSize || s.Num&(s.Num-1) != 0 {
		return fmt.Errorf("vring %d: size %d not a power of two in 1..%d: %w", i, s.Num, virtqueue.MaxQueueSize, ErrInvalid)
	}
	return d.withPair(i, func(r *vring) {
		r.num = uint16(s.Num)
	})
}

func (d *device) setVringBase(s VringState) error {
	i, err := d.checkRing(s.Index)
	if err != nil {
		return err
	}
	if s.Num > 0xffff {
		// Packed rings put a wrap counter in bit 15 of a 32-bit value;
		// RING_PACKED is not offered, so anything wider is garbage.
		return fmt.Errorf("vring %d: base %#x: %w", i, s.Num, ErrInvalid)
	}
	return d.withPair(i, func(r *vring) {
		r.base = uint16(s.Num)
	})
}

func (d *device) setVringAddr(a VringAddr) error {
	i, err := d.checkRing(a.Index)
	if err != nil {
		return err
	}
	addr := virtqueue.Addresses{Desc: a.Desc, Avail: a.Avail, Used: a.Used}
	if err := d.checkRingAddr(i, addr, d.rings[i].num); err != nil {
		return err
	}
	// QEMU sets the log flag only together with VHOST_F_LOG_ALL (a
	// migration); refusing the ring would take the network down for a
	// front-end that sets it anyway, so say it once.
	if a.Flags&VringFlagLog != 0 && d.features&FeatureLogAll == 0 && !d.warnedVringLog {
		d.warnedVringLog = true
		d.log.Warn("vhost-user SET_VRING_ADDR asks for dirty logging (VHOST_VRING_F_LOG) "+
			"but VHOST_F_LOG_ALL is not negotiated: the used ring is logged only once it is", "vring", i)
	}
	return d.withPair(i, func(r *vring) {
		r.addr, r.addrSet, r.addrFlags, r.logAddr = addr, true, a.Flags, a.Log
	})
}

// checkRingAddr checks that a ring's three parts are aligned and lie inside
// mapped memory, for num entries (1 when the size is not known yet; the
// queue is checked again, fully, whenever it is built).
func (d *device) checkRingAddr(i int, a virtqueue.Addresses, num uint16) error {
	if len(d.mem.Regions()) == 0 {
		d.warnNoMemory()
		return fmt.Errorf("vring %d addr: no guest memory regions: %w", i, ErrInvalid)
	}
	if num == 0 {
		num = 1
	}
	// The trailing used_event/avail_event fields exist only with EVENT_IDX,
	// as NewSplitQueue sees it: a ring ending exactly at the end of a
	// region is legal without it. Features come before the rings (QEMU);
	// a later SET_FEATURES rebuilds the queues, which checks again.
	var ev uint64
	if d.features&(1<<virtqueue.FeatureRingEventIdx) == 0 {
		ev = 2
	}
	parts := []struct {
		name       string
		uva, n, al uint64
	}{
		{"descriptor table", a.Desc, virtqueue.DescTableSize(num), 16},
		{"avail ring", a.Avail, virtqueue.AvailRingSize(num) - ev, 2},
		{"used ring", a.Used, virtqueue.UsedRingSize(num) - ev, 4},
	}
	for _, p := range parts {
		if p.uva%p.al != 0 {
			return fmt.Errorf("vring %d %s at %#x: not %d-byte aligned: %w", i, p.name, p.uva, p.al, ErrInvalid)
		}
		if _, err := d.mem.UserSlice(p.uva, p.n); err != nil {
			return fmt.Errorf("vring %d %s: %w: %w", i, p.name, ErrInvalid, err)
		}
	}
	return nil
}

func (d *device) getVringBase(s VringState) (uint16, error) {
	i, err := d.checkRing(s.Index)
	if err != nil {
		return 0, err
	}
	// GET_VRING_BASE stops the ring (spec, "Ring states"); the pair cannot
	// run on one ring, so the partner waits for this ring's next kick.
	d.stopPair(i / 2)
	r := &d.rings[i]
	r.started = false
	if r.kick >= 0 {
		unix.Close(r.kick)
		r.kick = -1
	}
	d.log.Debug("vring stopped", "vring", i, "base", r.base)
	d.noteRingStopped()
	return r.base, nil
}

// setVringFile handles SET_VRING_KICK, SET_VRING_CALL and SET_VRING_ERR
// (already validated: one fd unless the no-fd bit is set).
func (d *device) setVringFile(m *Message) error {
	v := mustU64(m.Payload)
	if v&^uint64(VringIndexMask|VringNoFDFlag) != 0 {
		return fmt.Errorf("vring file payload %#x: unknown bits: %w", v, ErrInvalid)
	}
	i, err := d.checkRing(uint32(v & VringIndexMask))
	if err != nil {
		return err
	}
	fd := -1
	if v&VringNoFDFlag == 0 {
		// Refused before anything changes; process closes the fd.
		if err := checkEventfd(m.FDs[0]); err != nil {
			return fmt.Errorf("%v vring %d: %w", m.Header.Request, i, err)
		}
		fd = m.takeFD(0)
	}
	// Every fd is replaced with the pair stopped: the running queue holds
	// the old one (the error fd too, written when the queue breaks).
	return d.withPair(i, func(r *vring) {
		if m.Header.Request == ReqSetVringErr {
			if r.errFD >= 0 {
				unix.Close(r.errFD)
			}
			r.errFD = fd
			return
		}
		if m.Header.Request == ReqSetVringKick {
			if r.kick >= 0 {
				unix.Close(r.kick)
			}
			r.kick = fd
			r.started = true
			return
		}
		if r.call >= 0 {
			unix.Close(r.call)
		}
		r.call = fd
		r.freshCall = fd >= 0
	})
}

func (d *device) setVringEnable(s VringState) error {
	i, err := d.checkRing(s.Index)
	if err != nil {
		return err
	}
	if s.Num > 1 {
		return fmt.Errorf("vring %d: enable %d: %w", i, s.Num, ErrInvalid)
	}
	on := s.Num == 1
	if d.rings[i].enabled == on {
		return nil
	}
	return d.withPair(i, func(r *vring) {
		r.enabled = on
	})
}

// disableRings implements the deprecated RESET_OWNER as the spec
// recommends: every ring stopped (as GET_VRING_BASE would) and disabled.
// Descriptors, addresses, sizes, bases, memory, features and the data
// plane's session stay; a SET_VRING_KICK (and SET_VRING_ENABLE) starts a
// ring again where it stopped.
func (d *device) disableRings() {
	d.stopAll()
	for i := range d.rings {
		d.rings[i].started = false
		d.rings[i].enabled = false
	}
}

// resetDevice implements RESET_DEVICE: back to the state of a fresh
// connection, except ownership and the memory table (QEMU does not resend
// an unchanged memory table after a reset). All rings stopped and
// forgotten, negotiated features, protocol features and status cleared, and
// the data plane's session ended (its flows belong to a guest that is gone).
func (d *device) resetDevice() {
	d.stopAll()
	for i := range d.rings {
		d.rings[i].closeFDs()
		d.rings[i].reset()
	}
	d.status = 0
	d.features, d.protocol = 0, 0
	d.unmapLog(d.dirtyLog)
	d.dirtyLog = nil
	d.stats.Features.Store(0)
	d.stats.ProtocolFeatures.Store(0)
	d.endSession()
}

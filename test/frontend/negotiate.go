package frontend

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Order is a front-end's message order at start-up.
type Order int

const (
	// OrderQEMU is QEMU 7.2's order (see FIELD-NOTES.md): per-pair feature
	// negotiation and memory regions, SET_VRING_BASE before SET_VRING_ADDR.
	OrderQEMU Order = iota
	// OrderDPDK is DPDK virtio-user's: SET_OWNER first, one SET_MEM_TABLE,
	// and a second SET_MEM_TABLE after the rings run, inside a
	// SET_VRING_ENABLE 0/1 toggle.
	OrderDPDK
)

// Options configures Negotiate. The zero value is a one-pair QEMU-like
// front-end with 256-entry rings and 32 MiB of single-region memory.
type Options struct {
	QueuePairs int    // default 1
	RingSize   uint16 // default 256; a power of two
	// RXRingSize / TXRingSize override RingSize for one direction (0 = RingSize),
	// e.g. a tiny RX ring that starves the device on purpose.
	RXRingSize, TXRingSize uint16
	FeatureMask            uint64 // virtio features to accept of those offered; 0 = DefaultFeatureMask
	ProtocolMask           uint64 // protocol features to accept; 0 = DefaultProtocolMask
	// MemTable sends SET_MEM_TABLE even when CONFIGURE_MEM_SLOTS is offered.
	MemTable bool
	Order    Order
	// Memory to use (shared across front-ends, e.g. for a reconnect test);
	// nil creates MemSize bytes in Layout, closed by Close.
	Memory  *Memory
	MemSize uint64 // default 32 MiB
	Layout  Layout
	// AckAll sets NEED_REPLY on every request without a reply of its own
	// (when REPLY_ACK is negotiated), so each failure surfaces at its request.
	AckAll bool
	// PollKick / PollCall send the no-fd flag instead of eventfds.
	PollKick, PollCall bool
	// MTU > 0 sends NET_SET_MTU when the MTU feature and protocol feature
	// are both negotiated.
	MTU int
	// EnablePairs is how many pairs get SET_VRING_ENABLE 1; 0 = all.
	EnablePairs int
	// VringBase is the SET_VRING_BASE value of fresh rings (lets tests start
	// near the 16-bit wrap).
	VringBase uint16
	// TXShape / RXShape are the initial chain shapes of every pair.
	TXShape, RXShape ChainShape
	// NoSync skips the final round trip that makes Negotiate return only
	// after the back-end has handled every message.
	NoSync bool
}

func (o Options) withDefaults() Options {
	if o.QueuePairs <= 0 {
		o.QueuePairs = 1
	}
	if o.RingSize == 0 {
		o.RingSize = 256
	}
	if o.RXRingSize == 0 {
		o.RXRingSize = o.RingSize
	}
	if o.TXRingSize == 0 {
		o.TXRingSize = o.RingSize
	}
	if o.FeatureMask == 0 {
		o.FeatureMask = DefaultFeatureMask
	}
	if o.ProtocolMask == 0 {
		o.ProtocolMask = DefaultProtocolMask
	}
	if o.MemSize == 0 {
		o.MemSize = 32 << 20
	}
	if o.EnablePairs <= 0 || o.EnablePairs > o.QueuePairs {
		o.EnablePairs = o.QueuePairs
	}
	return o
}

// Negotiate runs the start-up sequence of opts.Order and leaves every pair's
// rings started and (up to EnablePairs) enabled. Called again on a Frontend
// whose Conn was replaced (see Reconnect), it reuses memory and rings and
// starts the rings at their current used index, as QEMU does after a
// back-end restart.
func (f *Frontend) Negotiate(opts Options) error {
	opts = opts.withDefaults()
	f.opts = opts
	if f.Mem == nil {
		if opts.Memory != nil {
			f.Mem = opts.Memory
		} else {
			m, err := NewMemory(opts.MemSize, opts.Layout)
			if err != nil {
				return err
			}
			f.Mem, f.ownMem = m, true
		}
	}
	var err error
	switch opts.Order {
	case OrderDPDK:
		err = f.negotiateDPDK()
	default:
		err = f.negotiateQEMU()
	}
	if err != nil {
		return err
	}
	if !opts.NoSync {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("negotiate: final sync: %w", err)
		}
	}
	return nil
}

// Reconnect replaces the connection and replays the start-up sequence with
// the same memory, rings and eventfds.
func (f *Frontend) Reconnect(c *Conn) error {
	if f.Conn != nil {
		f.Conn.Close()
	}
	f.Conn = c
	return f.Negotiate(f.opts)
}

func (f *Frontend) features() error {
	off, err := f.GetFeatures()
	if err != nil {
		return fmt.Errorf("get features: %w", err)
	}
	f.Offered = off
	if off&Bit(FeatProtocolFeatures) == 0 {
		// QEMU 7.2 refuses to start such a back-end.
		return fmt.Errorf("back-end does not offer PROTOCOL_FEATURES (features %#x)", off)
	}
	f.Features = off & f.opts.FeatureMask
	po, err := f.GetProtocolFeatures()
	if err != nil {
		return fmt.Errorf("get protocol features: %w", err)
	}
	f.ProtocolOffered = po
	f.Protocol = po & f.opts.ProtocolMask
	if err := f.SetProtocolFeatures(f.Protocol); err != nil {
		return fmt.Errorf("set protocol features: %w", err)
	}
	return nil
}

func (f *Frontend) queueCount() error {
	if f.HasProtocol(ProtoMQ) {
		n, err := f.GetQueueNum()
		if err != nil {
			return fmt.Errorf("get queue num: %w", err)
		}
		f.QueueNum = n
		if uint64(f.opts.QueuePairs) > n {
			return fmt.Errorf("back-end offers %d queue pairs, want %d", n, f.opts.QueuePairs)
		}
	} else if f.opts.QueuePairs > 1 {
		return fmt.Errorf("back-end lacks protocol MQ, want %d queue pairs", f.opts.QueuePairs)
	}
	return nil
}

// makePairs creates the driver rings once; on a reconnect it keeps them.
func (f *Frontend) makePairs() error {
	if f.Pairs != nil {
		return nil
	}
	hdrLen := NetHdrLen(f.Features)
	evIdx := f.Has(FeatEventIdx)
	for i := 0; i < f.opts.QueuePairs; i++ {
		rx, err := newRing(f.Mem, 2*i, f.opts.RXRingSize, evIdx, f.opts.PollKick, f.opts.PollCall)
		if err != nil {
			return err
		}
		tx, err := newRing(f.Mem, 2*i+1, f.opts.TXRingSize, evIdx, f.opts.PollKick, f.opts.PollCall)
		if err != nil {
			rx.closeFDs()
			return err
		}
		for _, r := range []*Ring{rx, tx} {
			r.availIdx, r.published, r.lastUsed = f.opts.VringBase, f.opts.VringBase, f.opts.VringBase
			r.storeAvailWord()
			// The device reads the current used.idx from memory when the
			// ring starts; a fresh ring's must match the base.
			*u32at(r.used, 0) = uint32(f.opts.VringBase) << 16
		}
		f.Pairs = append(f.Pairs, &Pair{
			Index: i, RX: rx, TX: tx, mem: f.Mem,
			TXShape: f.opts.TXShape, RXShape: f.opts.RXShape,
			asm: rxAssembler{hdrLen: hdrLen, mrg: f.Has(FeatMrgRxbuf)},
		})
	}
	return nil
}

// errFD returns ring i's error eventfd, created once and kept across
// reconnects like the kick and call eventfds.
func (f *Frontend) errFD(i int) (int, error) {
	for len(f.errFDs) <= i {
		f.errFDs = append(f.errFDs, -1)
	}
	if f.errFDs[i] >= 0 {
		return f.errFDs[i], nil
	}
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("err eventfd: %w", err)
	}
	f.errFDs[i] = fd
	return fd, nil
}

// sendMemory sends the memory table: ADD_MEM_REG per region with
// CONFIGURE_MEM_SLOTS (unless Options.MemTable), else one SET_MEM_TABLE.
func (f *Frontend) sendMemory() error {
	regs := f.Mem.Regions()
	if f.HasProtocol(ProtoConfigureMemSlots) && !f.opts.MemTable {
		for i, r := range regs {
			if err := f.AddMemReg(r, f.Mem.FD()); err != nil {
				return fmt.Errorf("add mem reg %d: %w", i, err)
			}
		}
		return nil
	}
	fds := make([]int, len(regs))
	for i := range fds {
		fds[i] = f.Mem.FD()
	}
	if err := f.SetMemTable(regs, fds); err != nil {
		return fmt.Errorf("set mem table: %w", err)
	}
	return nil
}

// startRing sends NUM, BASE, ADDR, KICK (and CALL when withCall) for r.
// The base is the ring's used index: equal to the avail index the device
// must resume from, since every chain it popped before is either used or
// will be re-processed.
func (f *Frontend) startRing(r *Ring, withCall bool) error {
	idx := uint32(r.Index)
	if err := f.SetVringNum(idx, uint32(r.size)); err != nil {
		return fmt.Errorf("set vring num %d: %w", idx, err)
	}
	if err := f.SetVringBase(idx, uint32(r.UsedIdx())); err != nil {
		return fmt.Errorf("set vring base %d: %w", idx, err)
	}
	a, err := r.Addr()
	if err != nil {
		return err
	}
	if err := f.SetVringAddr(a); err != nil {
		return fmt.Errorf("set vring addr %d: %w", idx, err)
	}
	if err := f.SetVringFD(ReqSetVringKick, idx, r.kick); err != nil {
		return fmt.Errorf("set vring kick %d: %w", idx, err)
	}
	if withCall {
		if err := f.SetVringFD(ReqSetVringCall, idx, r.call); err != nil {
			return fmt.Errorf("set vring call %d: %w", idx, err)
		}
	}
	return nil
}

func (f *Frontend) enableRings(on bool) error {
	for _, p := range f.Pairs {
		en := on && p.Index < f.opts.EnablePairs
		for _, r := range []*Ring{p.RX, p.TX} {
			if err := f.SetVringEnable(uint32(r.Index), en); err != nil {
				return fmt.Errorf("set vring enable %d: %w", r.Index, err)
			}
		}
	}
	return nil
}

func (f *Frontend) negotiateQEMU() error {
	// Device initialisation: QEMU runs vhost_dev_init once per queue pair,
	// each repeating the feature negotiation.
	for i := 0; i < f.opts.QueuePairs; i++ {
		if err := f.features(); err != nil {
			return err
		}
		if i == 0 {
			if err := f.queueCount(); err != nil {
				return err
			}
			if f.HasProtocol(ProtoConfigureMemSlots) {
				n, err := f.GetMaxMemSlots()
				if err != nil {
					return fmt.Errorf("get max mem slots: %w", err)
				}
				f.MaxMemSlots = n
			}
			if err := f.SetOwner(); err != nil {
				return fmt.Errorf("set owner: %w", err)
			}
			if err := f.makePairs(); err != nil {
				return err
			}
		}
		if _, err := f.GetFeatures(); err != nil {
			return fmt.Errorf("get features: %w", err)
		}
		p := f.Pairs[i]
		for _, r := range []*Ring{p.RX, p.TX} {
			if err := f.SetVringFD(ReqSetVringCall, uint32(r.Index), r.call); err != nil {
				return fmt.Errorf("set vring call %d: %w", r.Index, err)
			}
			efd, err := f.errFD(r.Index)
			if err != nil {
				return err
			}
			if err := f.SetVringFD(ReqSetVringErr, uint32(r.Index), efd); err != nil {
				return fmt.Errorf("set vring err %d: %w", r.Index, err)
			}
		}
	}
	if err := f.enableRings(true); err != nil {
		return err
	}
	// DRIVER_OK: the guest driver finished probing.
	if f.opts.MTU > 0 && f.Has(FeatMTU) && f.HasProtocol(ProtoMTU) {
		if err := f.NetSetMTU(f.opts.MTU); err != nil {
			return fmt.Errorf("net set mtu: %w", err)
		}
	}
	for i, p := range f.Pairs {
		if err := f.SetFeatures(f.Features); err != nil {
			return fmt.Errorf("set features: %w", err)
		}
		if i == 0 && f.HasProtocol(ProtoStatus) {
			if _, err := f.GetStatus(); err != nil {
				return fmt.Errorf("get status: %w", err)
			}
			if err := f.SetStatus(StatusAcknowledge | StatusDriver | StatusFeaturesOK); err != nil {
				return fmt.Errorf("set status: %w", err)
			}
		}
		if err := f.sendMemory(); err != nil {
			return err
		}
		for _, r := range []*Ring{p.RX, p.TX} {
			if err := f.startRing(r, true); err != nil {
				return err
			}
		}
	}
	if err := f.enableRings(true); err != nil {
		return err
	}
	if f.HasProtocol(ProtoStatus) {
		if err := f.SetStatus(StatusAcknowledge | StatusDriver | StatusFeaturesOK | StatusDriverOK); err != nil {
			return fmt.Errorf("set status: %w", err)
		}
	}
	return nil
}

func (f *Frontend) negotiateDPDK() error {
	if err := f.SetOwner(); err != nil {
		return fmt.Errorf("set owner: %w", err)
	}
	if err := f.features(); err != nil {
		return err
	}
	if err := f.queueCount(); err != nil {
		return err
	}
	if err := f.SetFeatures(f.Features); err != nil {
		return fmt.Errorf("set features: %w", err)
	}
	if err := f.makePairs(); err != nil {
		return err
	}
	// DPDK always uses SET_MEM_TABLE.
	saved := f.opts.MemTable
	f.opts.MemTable = true
	defer func() { f.opts.MemTable = saved }()
	if err := f.sendMemory(); err != nil {
		return err
	}
	rings := f.Rings()
	for _, r := range rings {
		if err := f.SetVringFD(ReqSetVringCall, uint32(r.Index), r.call); err != nil {
			return fmt.Errorf("set vring call %d: %w", r.Index, err)
		}
	}
	for _, r := range rings {
		if err := f.startRing(r, false); err != nil {
			return err
		}
	}
	if err := f.enableRings(true); err != nil {
		return err
	}
	return f.RemapMemTable()
}

// RemapMemTable is DPDK's memory-hotplug sequence: disable every ring, send
// SET_MEM_TABLE again, re-enable the rings.
func (f *Frontend) RemapMemTable() error {
	if err := f.enableRings(false); err != nil {
		return err
	}
	saved := f.opts.MemTable
	f.opts.MemTable = true
	err := f.sendMemory()
	f.opts.MemTable = saved
	if err != nil {
		return err
	}
	return f.enableRings(true)
}

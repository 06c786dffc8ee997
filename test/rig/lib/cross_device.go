package rig

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"vunet/test/frontend"
	"vunet/virtqueue"
)

// crossDevice is the device side of the rig-alone mode (Options.Loopback):
// it stands where a back-end would and does the least a device can. Every
// frame the guest on one queue pair transmits is copied, virtio-net header
// and all, into an RX buffer of the other pair, so two TAPs bridged by the
// rig's unchanged front-end talk to each other (kernel ↔ rig ↔ kernel).
//
// It uses vunet's own device-side ring code (virtqueue), with EVENT_IDX and
// batched used-ring updates, and the copy is the one a back-end makes into
// RX buffers anyway. To add no thread hand-off of its own, the copying runs
// inline on the bridge's TX thread right after it publishes (pump), and so
// does, when serve is set and the pump moved at most inlineFrames frames,
// the other bridge's RX side: the frames go on to the other TAP on that
// same thread (bridge.serveRX). A lone frame (a request, a reply, a
// handshake segment) then wakes one rig thread on its way from one kernel
// to the other (the TX loop that reads it from the TAP), as a frame between
// a guest and a back-end wakes one (the TX loop one way, the RX loop the
// other), and the rig's work on it is the same: TAP read, ring, ring, TAP
// write. So a round trip through the rig alone costs the rig's share of a
// round trip through a back-end once, and never more than the whole. A
// larger batch (a bulk transfer) goes to the other bridge's RX loop
// instead, woken by a call, so that reading one TAP and writing the other
// overlap as they do around a back-end. The device's thread only waits for
// RX buffers when the other side has none.
type crossDevice struct {
	log  *slog.Logger
	mem  *virtqueue.Memory
	side [2]crossSide
	stop int // eventfd
	wake int // eventfd: a side waits for RX buffers
	wg   sync.WaitGroup
	// serve[i], if set before start, writes what side i's RX ring holds to
	// its TAP: run after a move of at most inlineFrames frames into that
	// ring, on the mover's thread; a larger move calls the ring's RX loop.
	serve [2]func() error

	errMu sync.Mutex
	err   error
}

// crossSide is one queue pair: its TX ring feeds the other side's RX ring.
// mu guards the TX ring's and the other side's RX ring's device state: the
// bridge's TX thread (pump) and the device's thread (RX waits) share them.
type crossSide struct {
	mu      sync.Mutex
	tx, rx  *virtqueue.SplitQueue
	c, rc   virtqueue.Chain
	rxWait  bool // a TX frame waits for an RX buffer of the other side
	stats   virtqueue.Stats
	rxStats virtqueue.Stats
}

// crossBatch bounds the frames moved per direction between used-ring
// publications, as a back-end's TX batch does.
const crossBatch = 64

// inlineFrames is the most frames a move hands to the other TAP on the
// mover's own thread (crossDevice.serve); more go to that side's RX loop.
const inlineFrames = 4

// newCrossDevice maps the front-end's memory a second time (as a back-end
// would) and takes the device side of the rings of two queue pairs, each
// given as {RX, TX}.
func newCrossDevice(mem *frontend.Memory, pairs [2][2]*frontend.Ring, log *slog.Logger) (_ *crossDevice, err error) {
	d := &crossDevice{log: log, stop: -1}
	var regions []*virtqueue.Region
	defer func() {
		if err != nil {
			for _, r := range regions {
				r.Unmap()
			}
			for _, fd := range []int{d.stop, d.wake} {
				if fd >= 0 {
					unix.Close(fd)
				}
			}
		}
	}()
	for _, r := range mem.Regions() {
		reg, err := virtqueue.MapRegion(mem.FD(), virtqueue.RegionSpec{
			GuestAddr: r.GuestAddr, Size: r.Size, UserAddr: r.UserAddr, MmapOffset: r.MmapOffset})
		if err != nil {
			return nil, err
		}
		regions = append(regions, reg)
	}
	if d.mem, err = virtqueue.NewMemory(regions); err != nil {
		return nil, err
	}
	for i, p := range pairs {
		s := &d.side[i]
		if s.rx, err = deviceQueue(d.mem, p[0], &s.rxStats, log); err != nil {
			return nil, err
		}
		if s.tx, err = deviceQueue(d.mem, p[1], &s.stats, log); err != nil {
			return nil, err
		}
		// TX is pumped by the bridge itself; RX kicks matter only while a
		// frame waits for buffers.
		s.tx.DisableKicks()
		s.rx.DisableKicks()
	}
	d.wake = -1
	if d.stop, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("stop eventfd: %w", err)
	}
	if d.wake, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("wake eventfd: %w", err)
	}
	return d, nil
}

func deviceQueue(mem *virtqueue.Memory, r *frontend.Ring, st *virtqueue.Stats, log *slog.Logger) (*virtqueue.SplitQueue, error) {
	a, err := r.Addr()
	if err != nil {
		return nil, err
	}
	return virtqueue.NewSplitQueue(virtqueue.Config{
		Index: r.Index, Size: r.Size(), EventIdx: true,
		Addr: virtqueue.Addresses{Desc: a.Desc, Avail: a.Avail, Used: a.Used},
		Kick: r.KickFD(), Call: r.CallFD(), Mem: mem, Stats: st, Logger: log,
	})
}

func (d *crossDevice) start() {
	d.wg.Add(1)
	reserveP(1)
	go func() {
		defer d.wg.Done()
		defer reserveP(-1)
		runtime.LockOSThread()
		if err := d.run(); err != nil {
			d.fail(err)
		}
	}()
}

// close stops the device and unmaps its view of guest memory.
func (d *crossDevice) close() error {
	var one [8]byte
	binary.LittleEndian.PutUint64(one[:], 1)
	unix.Write(d.stop, one[:])
	d.wg.Wait()
	unix.Close(d.stop)
	unix.Close(d.wake)
	for _, r := range d.mem.Regions() {
		r.Unmap()
	}
	d.errMu.Lock()
	defer d.errMu.Unlock()
	return d.err
}

// pump moves what side i's guest just published, on the caller's (the
// bridge TX loop's) thread; a frame left waiting for RX buffers is handed
// to the device's thread.
func (d *crossDevice) pump(i int) {
	s, o := &d.side[i], &d.side[1-i]
	s.mu.Lock()
	n, err := d.drain(s, o)
	wait := s.rxWait
	s.mu.Unlock()
	if err == nil {
		err = d.deliver(1-i, n)
	}
	if err != nil {
		d.fail(err)
		return
	}
	if wait {
		notify(d.wake)
	}
}

// deliver has the n frames just moved into side i's RX ring written to its
// TAP: here with serve and at most inlineFrames of them, else by the RX
// loop, called for it (without serve, the ring's own call suffices).
func (d *crossDevice) deliver(i, n int) error {
	switch {
	case d.serve[i] == nil || n == 0:
		return nil
	case n <= inlineFrames:
		return d.serve[i]()
	}
	return d.side[i].rx.Signal()
}

func (d *crossDevice) fail(err error) {
	d.errMu.Lock()
	defer d.errMu.Unlock()
	if d.err == nil {
		d.err = err
		d.log.Error("rig cross device stopped", "err", err)
	}
}

// drain moves batches until the TX ring is empty or the RX ring full, and
// returns how many frames it moved.
func (d *crossDevice) drain(s, o *crossSide) (int, error) {
	total := 0
	for {
		n, err := d.move(s, o)
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

// run is the device's own thread: it retries sides whose frames wait for
// RX buffers, sleeping on those RX rings' kicks (EVENT_IDX re-checked).
func (d *crossDevice) run() error {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll_create1: %w", err)
	}
	defer unix.Close(ep)
	fds := []int{d.stop, d.wake, d.side[0].rx.KickFD(), d.side[1].rx.KickFD()}
	for _, fd := range fds {
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			return fmt.Errorf("epoll add fd %d: %w", fd, err)
		}
	}
	evs := make([]unix.EpollEvent, len(fds))
	for {
		more := false
		for i := range d.side {
			s, o := &d.side[i], &d.side[1-i]
			s.mu.Lock()
			moved := 0
			if s.rxWait {
				o.rx.DisableKicks()
				var err error
				if moved, err = d.drain(s, o); err != nil {
					s.mu.Unlock()
					return err
				}
			}
			if s.rxWait {
				more = o.rx.EnableKicks() || more
			} else {
				o.rx.DisableKicks()
			}
			s.mu.Unlock()
			if err := d.deliver(1-i, moved); err != nil {
				return err
			}
		}
		if more {
			continue
		}
		n, err := unix.EpollWait(ep, evs, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for _, ev := range evs[:n] {
			if int(ev.Fd) == d.stop {
				return nil
			}
			var b [8]byte
			unix.Read(int(ev.Fd), b[:])
		}
	}
}

// move copies up to crossBatch frames from s's TX ring into o's RX ring and
// publishes both rings once. It returns how many it moved.
func (d *crossDevice) move(s, o *crossSide) (int, error) {
	n := 0
	s.rxWait = false
	for n < crossBatch {
		ok, err := s.tx.Pop(&s.c)
		if err != nil {
			return 0, fmt.Errorf("TX ring %w", err)
		}
		if !ok {
			break
		}
		ok, err = o.rx.Pop(&o.rc)
		if err != nil {
			return 0, fmt.Errorf("RX ring %w", err)
		}
		if !ok {
			s.tx.Unpop(1)
			s.rxWait = true
			break
		}
		w := 0
		for _, b := range s.c.Readable {
			w += o.rc.CopyToWritable(w, b)
		}
		if w >= 12 {
			// num_buffers of the virtio-net header: one buffer per frame.
			binary.LittleEndian.PutUint16(o.rc.Writable[0][10:], 1)
		}
		o.rx.Push(o.rc.Head, uint32(w))
		s.tx.Push(s.c.Head, 0)
		n++
	}
	o.rx.Flush()
	s.tx.Flush()
	return n, nil
}

// notify adds 1 to an eventfd (a full counter means a wake-up is pending
// anyway).
func notify(fd int) {
	var one [8]byte
	binary.LittleEndian.PutUint64(one[:], 1)
	unix.Write(fd, one[:])
}

package rig

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"vunet/test/frontend"
)

// maxRigPairs bounds the queue pairs a rig bridges.
const maxRigPairs = 8

// Stats counts what the bridge moved; all fields are atomics, readable while
// the rig runs.
type Stats struct {
	// TXFrames/TXBytes: frames read from the TAP and handed to the back-end
	// (bytes include the virtio-net header).
	TXFrames, TXBytes atomic.Uint64
	// TXRingFull counts times the TAP had frames but every TX descriptor was
	// in the back-end's hands.
	TXRingFull atomic.Uint64
	// RXFrames/RXBytes: frames the back-end completed and the rig wrote to
	// the TAP (bytes include the virtio-net header).
	RXFrames, RXBytes atomic.Uint64
	// RXCalls counts the RX loops' wake-ups on a call of their ring; in
	// the rig alone without damage, the device writes to the TAPs itself
	// and none is due.
	RXCalls atomic.Uint64
	// RXLoopFrames counts the frames the RX loops wrote to the TAPs
	// themselves; in the rig alone the device writes lone frames on the
	// thread that moved them, and the loops write only batches.
	RXLoopFrames atomic.Uint64
	// RXWriteErrors counts TAP writes the kernel refused (frame dropped).
	RXWriteErrors atomic.Uint64
	// RXHeldBatches counts slow-reader delays (batches of used RX buffers
	// held back before being posted again).
	RXHeldBatches atomic.Uint64
	// DeviceErrors counts used elements that broke the ring contract.
	DeviceErrors atomic.Uint64
	// RXDataValid counts frames the back-end marked DATA_VALID whose TCP or
	// UDP checksum the rig handed to the kernel as trusted (trustDataValid),
	// as a virtio guest trusts it.
	RXDataValid atomic.Uint64
	// TXFramesByPair and RXFramesByPair split TXFrames and RXFrames by
	// queue pair (Options.QueuePairs).
	TXFramesByPair, RXFramesByPair [maxRigPairs]atomic.Uint64
	// TXMoves counts moves of the guest's transmissions to the next TX
	// queue (Options.TXRotate).
	TXMoves atomic.Uint64
	// Impaired counts what Options.Impair did, per direction (0: guest to
	// back-end, 1: back-end to guest).
	Impaired [2]ImpairStats
}

// bridgeConfig describes one bridge: a TAP and the queue pairs it feeds.
type bridgeConfig struct {
	tap    int
	hdrLen int
	mrg    bool
	// tx and rx are the pairs' rings, pair i at index i.
	tx, rx []*frontend.FixedRing
	slowRX time.Duration
	// rotate > 0 moves the guest's transmissions to the next TX ring that
	// often; eager moves them without waiting for the old ring to drain.
	rotate time.Duration
	eager  bool
	// impair, with seed, damages frames both ways (impair.go).
	impair Impairment
	seed   uint64
	// observe, if set, sees every frame the back-end sent, on the thread
	// that writes it to the TAP, before it is written.
	observe func(pair int, frame []byte)
	// observeHdr, if set, sees the same with the frame's virtio-net
	// header, before the rig changes it.
	observeHdr func(pair int, hdr frontend.NetHdr, frame []byte)
	// inlineRX: the device serves the RX rings itself (serveRX) right
	// after filling them, and the RX loops keep their interrupts off.
	inlineRX bool
	stats    *Stats
	log      *slog.Logger
}

// bridge moves frames between the TAP and the queue pairs: one locked
// thread takes the TAP's frames to the current TX ring, one per RX ring
// writes what the back-end sent to the TAP, each blocked in epoll when
// there is nothing to do.
type bridge struct {
	bridgeConfig
	batch int

	rxp []*rxPath // one per RX ring

	// cur is the TX ring the guest's frames go to; moving is set when
	// the rotation timer asked for the next one (TX thread only).
	cur    int
	moving bool
	txImp  impairer

	// afterPublish, if set, runs on the TX thread after each TX publish:
	// the rig-alone device moves the frames right there (crossDevice.pump).
	afterPublish func()

	stop  int // eventfd: written once by close
	wg    sync.WaitGroup
	errMu sync.Mutex
	err   error
}

func newBridge(c bridgeConfig) (*bridge, error) {
	if len(c.tx) == 0 || len(c.tx) != len(c.rx) || len(c.tx) > maxRigPairs {
		return nil, fmt.Errorf("bridge: %d TX and %d RX rings", len(c.tx), len(c.rx))
	}
	stop, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("stop eventfd: %w", err)
	}
	b := &bridge{bridgeConfig: c, stop: stop}
	b.batch = min(max(int(c.tx[0].Ring().Size())/4, 1), 64)
	b.txImp = newImpairer(c.impair, c.seed, 0, &c.stats.Impaired[0])
	for i := range c.rx {
		p, err := newRXPath(b, i)
		if err != nil {
			b.closePaths()
			unix.Close(stop)
			return nil, err
		}
		b.rxp = append(b.rxp, p)
		if c.inlineRX {
			// Before the device runs: its first used element would call.
			p.rx.Ring().DisableInterrupts()
		}
	}
	return b, nil
}

func (b *bridge) start() {
	b.wg.Add(1 + len(b.rx))
	reserveP(1 + len(b.rx)) // each loop's run gives its P back
	go b.run("tx", b.txLoop)
	for i := range b.rx {
		pair := i
		go b.run(fmt.Sprintf("rx%d", i), func() error { return b.rxLoop(pair) })
	}
}

func (b *bridge) run(name string, loop func() error) {
	defer b.wg.Done()
	defer reserveP(-1)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := loop(); err != nil {
		b.log.Error("rig bridge loop stopped", "dir", name, "err", err)
		b.errMu.Lock()
		if b.err == nil {
			b.err = fmt.Errorf("%s loop: %w", name, err)
		}
		b.errMu.Unlock()
	}
}

// close stops every loop and waits for them; the rings are then idle.
func (b *bridge) close() error {
	var one [8]byte
	binary.LittleEndian.PutUint64(one[:], 1)
	unix.Write(b.stop, one[:])
	b.wg.Wait()
	unix.Close(b.stop)
	b.closePaths()
	b.errMu.Lock()
	defer b.errMu.Unlock()
	return b.err
}

func (b *bridge) closePaths() {
	for _, p := range b.rxp {
		p.close()
	}
}

// failed reports a loop's fatal error, if any.
func (b *bridge) failed() error {
	b.errMu.Lock()
	defer b.errMu.Unlock()
	return b.err
}

func newEpoll(fds ...[2]int) (int, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("epoll_create1: %w", err)
	}
	for _, f := range fds {
		ev := unix.EpollEvent{Events: uint32(f[1]), Fd: int32(f[0])}
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, f[0], &ev); err != nil {
			unix.Close(ep)
			return -1, fmt.Errorf("epoll add fd %d: %w", f[0], err)
		}
	}
	return ep, nil
}

func epollWait(ep int, evs []unix.EpollEvent, timeout int) (int, error) {
	for {
		n, err := unix.EpollWait(ep, evs, timeout)
		if err == unix.EINTR {
			continue
		}
		return n, err
	}
}

func drain(fd int) {
	var buf [8]byte
	unix.Read(fd, buf[:])
}

// txLoop: guest → back-end. The TAP is edge-triggered: it is read until
// EAGAIN, or until the current TX ring has no free descriptor, in which
// case the loop asks for a TX interrupt and resumes reading when
// descriptors return.
//
// With a rotation, a timer moves the guest's transmissions to the next
// ring the way a Linux guest moves a socket to another TX queue when its
// thread changes CPU: once everything handed to the old ring came back
// (the socket's ooo_okay), or at once when eager. While the old ring
// drains, the TAP is not read: its frames wait in the TAP's queue.
func (b *bridge) txLoop() error {
	fds := [][2]int{{b.tap, unix.EPOLLIN | unix.EPOLLET}, {b.stop, unix.EPOLLIN}}
	for _, tx := range b.tx {
		fds = append(fds, [2]int{tx.Ring().CallFD(), unix.EPOLLIN})
	}
	timer := -1
	if b.rotate > 0 {
		var err error
		if timer, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err != nil {
			return fmt.Errorf("timerfd: %w", err)
		}
		defer unix.Close(timer)
		ts := unix.NsecToTimespec(b.rotate.Nanoseconds())
		if err := unix.TimerfdSettime(timer, 0, &unix.ItimerSpec{Interval: ts, Value: ts}, nil); err != nil {
			return fmt.Errorf("timerfd_settime: %w", err)
		}
		fds = append(fds, [2]int{timer, unix.EPOLLIN})
	}
	ep, err := newEpoll(fds...)
	if err != nil {
		return err
	}
	defer unix.Close(ep)
	evs := make([]unix.EpollEvent, len(fds))
	tapReadable := true
	for _, tx := range b.tx {
		tx.Ring().DisableInterrupts()
	}
	for {
		if err := b.reclaimTX(); err != nil {
			return err
		}
		if b.moving {
			old := b.tx[b.cur]
			// A frame held back to be reordered belongs to the old ring.
			if b.txImp.flush(b, old, b.cur) > 0 {
				if err := b.publishTX(old); err != nil {
					return err
				}
			}
			if b.eager || old.Outstanding() == 0 {
				old.Ring().DisableInterrupts()
				b.cur = (b.cur + 1) % len(b.tx)
				b.moving = false
				b.stats.TXMoves.Add(1)
			}
		}
		tx := b.tx[b.cur]
		txr := tx.Ring()
		posted := 0
		for !b.moving && tapReadable && posted < b.batch {
			id, ok := tx.Get()
			if ok && b.impair.Duplicate > 0 && tx.NumFree() == 0 {
				// A frame to duplicate needs a second descriptor.
				tx.Put(id)
				ok = false
			}
			if !ok {
				b.stats.TXRingFull.Add(1)
				break
			}
			n, err := unix.Read(b.tap, tx.Buf(id))
			if err != nil {
				tx.Put(id)
				if err == unix.EAGAIN {
					tapReadable = false
					break
				}
				if err == unix.EINTR {
					continue
				}
				return fmt.Errorf("read tap: %w", err)
			}
			if n <= b.hdrLen {
				tx.Put(id)
				continue
			}
			posted += b.txImp.post(b, tx, id, n, b.cur)
		}
		if !tapReadable {
			// Nothing more comes for a while: a frame held back to be
			// reordered goes now.
			posted += b.txImp.flush(b, tx, b.cur)
		}
		if posted > 0 {
			if err := b.publishTX(tx); err != nil {
				return err
			}
		}
		switch {
		case b.moving:
			// Wait for the old ring's last completions.
			if txr.EnableInterrupts() {
				continue
			}
		case tapReadable:
			if tx.NumFree() > b.spare() {
				continue // batch limit: publish early, keep reading
			}
			// Starved of descriptors: wait for the back-end to return some.
			if txr.EnableInterrupts() {
				continue
			}
		default:
			txr.DisableInterrupts()
		}
		n, err := epollWait(ep, evs, -1)
		if err != nil {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for _, ev := range evs[:n] {
			switch fd := int(ev.Fd); fd {
			case b.stop:
				return nil
			case b.tap:
				tapReadable = true
			case timer:
				drain(timer)
				b.moving = true
			default:
				drain(fd) // a TX ring's call
			}
		}
	}
}

// spare is how many TX descriptors the read loop leaves free: one for a
// copy when frames are duplicated.
func (b *bridge) spare() int {
	if b.impair.Duplicate > 0 {
		return 1
	}
	return 0
}

// publishTX makes what was posted on tx visible to the back-end.
func (b *bridge) publishTX(tx *frontend.FixedRing) error {
	if _, err := tx.Publish(); err != nil {
		return err
	}
	if b.afterPublish != nil {
		b.afterPublish()
	}
	return nil
}

// countTX counts one frame handed to pair's TX ring.
func (b *bridge) countTX(pair, n int) {
	b.stats.TXFrames.Add(1)
	b.stats.TXBytes.Add(uint64(n))
	b.stats.TXFramesByPair[pair].Add(1)
}

func (b *bridge) reclaimTX() error {
	for _, tx := range b.tx {
		for {
			u, ok, err := tx.PopUsed()
			if !ok {
				break
			}
			if err != nil {
				b.stats.DeviceErrors.Add(1)
				return err
			}
			tx.Put(uint16(u.ID))
		}
	}
	return nil
}

// rxLoop: back-end → guest, for one pair's RX ring (rxPath), on its
// call. With inlineRX, the device serves the ring itself and the loop
// keeps the ring's interrupts off: it wakes for the slow reader's timer,
// and on a call only if the device ever makes one.
func (b *bridge) rxLoop(pair int) error {
	p := b.rxp[pair]
	rxr := p.rx.Ring()
	call := rxr.CallFD()
	fds := [][2]int{{call, unix.EPOLLIN}, {b.stop, unix.EPOLLIN}}
	if p.timer >= 0 {
		fds = append(fds, [2]int{p.timer, unix.EPOLLIN})
	}
	ep, err := newEpoll(fds...)
	if err != nil {
		return err
	}
	defer unix.Close(ep)
	evs := make([]unix.EpollEvent, 4)
	for {
		wrote, err := b.serveRXCount(pair)
		if err != nil {
			return err
		}
		b.stats.RXLoopFrames.Add(wrote)
		if !b.inlineRX && rxr.EnableInterrupts() {
			continue
		}
		n, err := epollWait(ep, evs, -1)
		if err != nil {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for _, ev := range evs[:n] {
			switch int(ev.Fd) {
			case b.stop:
				return nil
			case call:
				rxr.DrainCall()
				b.stats.RXCalls.Add(1)
			case p.timer:
				p.mu.Lock()
				err := p.repostHeld()
				p.mu.Unlock()
				if err != nil {
					return err
				}
			}
		}
	}
}

// serveRX writes what the back-end completed on pair's RX ring to the TAP,
// from any thread (the RX loop's, or the rig-alone device's with
// inlineRX).
func (b *bridge) serveRX(pair int) error {
	_, err := b.serveRXCount(pair)
	return err
}

// serveRXCount is serveRX, returning how many frames it wrote (frames of
// a pair are written only under its lock, held here).
func (b *bridge) serveRXCount(pair int) (uint64, error) {
	p := b.rxp[pair]
	p.mu.Lock()
	defer p.mu.Unlock()
	before := b.stats.RXFramesByPair[pair].Load()
	if err := p.serve(); err != nil {
		return 0, err
	}
	if b.inlineRX {
		// Keep the device from calling (used_event far ahead again).
		p.rx.Ring().DisableInterrupts()
	}
	return b.stats.RXFramesByPair[pair].Load() - before, nil
}

// rxWriter writes frames of one RX ring to the TAP.
type rxWriter struct {
	b    *bridge
	pair int
	rx   *frontend.FixedRing
	iov  []unix.Iovec
}

// write writes one received frame (header included) to the TAP from the
// guest buffers themselves: write(2) for one buffer, writev(2) for a
// merged one. A DATA_VALID frame is first made acceptable to the TAP the
// way a virtio guest would take it (trustDataValid).
func (w *rxWriter) write(heads []uint16, lens []uint32) {
	b, rx, iov := w.b, w.rx, w.iov
	frameLen := -b.hdrLen
	for _, l := range lens {
		frameLen += int(l)
	}
	first := rx.Buf(heads[0])[:lens[0]]
	if b.observeHdr != nil && len(first) > b.hdrLen {
		if h, err := frontend.DecodeNetHdr(first, b.hdrLen); err == nil {
			b.observeHdr(w.pair, h, first[b.hdrLen:])
		}
	}
	if trustDataValid(first, b.hdrLen, frameLen) {
		b.stats.RXDataValid.Add(1)
	}
	if b.observe != nil && len(first) > b.hdrLen {
		b.observe(w.pair, first[b.hdrLen:])
	}
	var total uint64
	var err error
	if len(heads) == 1 {
		total = uint64(len(first))
		_, err = unix.Write(b.tap, first)
	} else {
		n := 0
		for i, h := range heads {
			if lens[i] == 0 {
				continue
			}
			buf := rx.Buf(h)
			iov[n].Base = &buf[0]
			iov[n].SetLen(int(lens[i]))
			total += uint64(lens[i])
			n++
		}
		_, _, e := syscall.Syscall(unix.SYS_WRITEV, uintptr(b.tap), uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
		if e != 0 {
			err = e
		}
	}
	if err != nil {
		// The kernel drops what it cannot take (a full backlog, a frame it
		// finds malformed); TCP in the namespace recovers like on a NIC.
		b.stats.RXWriteErrors.Add(1)
		if !errors.Is(err, unix.EAGAIN) {
			b.log.Debug("tap write", "err", err, "bytes", total)
		}
		return
	}
	b.stats.RXFrames.Add(1)
	b.stats.RXBytes.Add(total)
	b.stats.RXFramesByPair[w.pair].Add(1)
}

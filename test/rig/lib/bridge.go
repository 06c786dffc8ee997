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
	// observe, if set, sees every frame the back-end sent, on the RX
	// thread of its pair, before it is written to the TAP.
	observe func(pair int, frame []byte)
	stats   *Stats
	log     *slog.Logger
}

// bridge moves frames between the TAP and the queue pairs: one locked
// thread takes the TAP's frames to the current TX ring, one per RX ring
// writes what the back-end sent to the TAP, each blocked in epoll when
// there is nothing to do.
type bridge struct {
	bridgeConfig
	batch int

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
	b.errMu.Lock()
	defer b.errMu.Unlock()
	return b.err
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

// rxLoop: back-end → guest, for one pair's RX ring. Used RX buffers are
// written to the TAP as they are (virtio-net header first) and posted
// again at once, or, in slow-reader mode, held until a timer fires every
// slowRX.
func (b *bridge) rxLoop(pair int) error {
	rx := b.rx[pair]
	rxr := rx.Ring()
	call := rxr.CallFD()
	timer := -1
	fds := [][2]int{{call, unix.EPOLLIN}, {b.stop, unix.EPOLLIN}}
	if b.slowRX > 0 {
		var err error
		timer, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
		if err != nil {
			return fmt.Errorf("timerfd: %w", err)
		}
		defer unix.Close(timer)
		fds = append(fds, [2]int{timer, unix.EPOLLIN})
	}
	ep, err := newEpoll(fds...)
	if err != nil {
		return err
	}
	defer unix.Close(ep)
	evs := make([]unix.EpollEvent, 4)
	imp := newImpairer(b.impair, b.seed, 1+uint64(pair), &b.stats.Impaired[1])

	size := int(rxr.Size())
	held := make([]uint16, 0, size)
	frame := make([]uint16, 0, size) // used heads of the frame being assembled (MRG_RXBUF)
	frameLens := make([]uint32, 0, size)
	want := 0
	iov := make([]unix.Iovec, size)
	armed := false
	w := rxWriter{b: b, pair: pair, rx: rx, iov: iov}

	for {
		id, ok := rx.Get()
		if !ok {
			break
		}
		rx.Post(id, 0)
	}
	if _, err := rx.Publish(); err != nil {
		return err
	}
	// release gives a written (or dropped) frame's buffers back.
	reposted := 0
	release := func(heads []uint16) {
		for _, h := range heads {
			if b.slowRX > 0 {
				held = append(held, h)
			} else {
				rx.Post(h, 0)
				reposted++
			}
		}
	}
	for {
		reposted = 0
		for {
			u, ok, err := rx.PopUsed()
			if !ok {
				break
			}
			if err != nil {
				b.stats.DeviceErrors.Add(1)
				return err
			}
			id := uint16(u.ID)
			if len(frame) == 0 {
				want = 1
				if b.mrg {
					if int(u.Len) < b.hdrLen {
						return fmt.Errorf("rx: used length %d below the %d-byte header", u.Len, b.hdrLen)
					}
					want = int(binary.LittleEndian.Uint16(rx.Buf(id)[10:12]))
					if want < 1 || want > size {
						return fmt.Errorf("rx: num_buffers %d with a %d-entry ring", want, size)
					}
				}
			}
			frame = append(frame, id)
			frameLens = append(frameLens, u.Len)
			if len(frame) < want {
				continue
			}
			imp.deliver(&w, frame, frameLens, release)
			frame, frameLens = frame[:0], frameLens[:0]
		}
		// Nothing more for now: a frame held back to be reordered goes.
		imp.flushRX(&w, release)
		if reposted > 0 {
			if _, err := rx.Publish(); err != nil {
				return err
			}
		}
		if len(held) > 0 && !armed {
			ts := unix.NsecToTimespec(b.slowRX.Nanoseconds())
			if err := unix.TimerfdSettime(timer, 0, &unix.ItimerSpec{Value: ts}, nil); err != nil {
				return fmt.Errorf("timerfd_settime: %w", err)
			}
			armed = true
			b.stats.RXHeldBatches.Add(1)
		}
		if rxr.EnableInterrupts() {
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
			case timer:
				drain(timer)
				armed = false
				for _, h := range held {
					rx.Post(h, 0)
				}
				held = held[:0]
				if _, err := rx.Publish(); err != nil {
					return err
				}
			}
		}
	}
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

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
}

// bridge moves frames between the TAP and one queue pair, one locked thread
// per direction, each blocked in epoll when there is nothing to do.
type bridge struct {
	tap    int
	hdrLen int
	mrg    bool
	tx, rx *frontend.FixedRing
	slowRX time.Duration
	batch  int
	stats  *Stats
	log    *slog.Logger

	// afterPublish, if set, runs on the TX thread after each TX publish:
	// the rig-alone device moves the frames right there (crossDevice.pump).
	afterPublish func()

	stop  int // eventfd: written once by close
	wg    sync.WaitGroup
	errMu sync.Mutex
	err   error
}

func newBridge(tap int, hdrLen int, mrg bool, tx, rx *frontend.FixedRing, slowRX time.Duration, stats *Stats, log *slog.Logger) (*bridge, error) {
	stop, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("stop eventfd: %w", err)
	}
	b := &bridge{tap: tap, hdrLen: hdrLen, mrg: mrg, tx: tx, rx: rx, slowRX: slowRX,
		stats: stats, log: log, stop: stop}
	b.batch = min(max(int(tx.Ring().Size())/4, 1), 64)
	return b, nil
}

func (b *bridge) start() {
	b.wg.Add(2)
	go b.run("tx", b.txLoop)
	go b.run("rx", b.rxLoop)
}

func (b *bridge) run(name string, loop func() error) {
	defer b.wg.Done()
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

// close stops both loops and waits for them; the rings are then idle.
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

func epollWait(ep int, evs []unix.EpollEvent) (int, error) {
	for {
		n, err := unix.EpollWait(ep, evs, -1)
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
// EAGAIN, or until the TX ring has no free descriptor, in which case the
// loop asks for a TX interrupt and resumes reading when descriptors return.
func (b *bridge) txLoop() error {
	txr := b.tx.Ring()
	call := txr.CallFD()
	ep, err := newEpoll([2]int{b.tap, unix.EPOLLIN | unix.EPOLLET}, [2]int{call, unix.EPOLLIN}, [2]int{b.stop, unix.EPOLLIN})
	if err != nil {
		return err
	}
	defer unix.Close(ep)
	evs := make([]unix.EpollEvent, 4)
	tapReadable := true
	txr.DisableInterrupts()
	for {
		if err := b.reclaimTX(); err != nil {
			return err
		}
		posted := 0
		for tapReadable && posted < b.batch {
			id, ok := b.tx.Get()
			if !ok {
				b.stats.TXRingFull.Add(1)
				break
			}
			n, err := unix.Read(b.tap, b.tx.Buf(id))
			if err != nil {
				b.tx.Put(id)
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
				b.tx.Put(id)
				continue
			}
			b.tx.Post(id, n)
			posted++
			b.stats.TXFrames.Add(1)
			b.stats.TXBytes.Add(uint64(n))
		}
		if posted > 0 {
			if _, err := b.tx.Publish(); err != nil {
				return err
			}
			if b.afterPublish != nil {
				b.afterPublish()
			}
		}
		if tapReadable {
			if b.tx.NumFree() > 0 {
				continue // batch limit: publish early, keep reading
			}
			// Starved of descriptors: wait for the back-end to return some.
			if txr.EnableInterrupts() {
				continue
			}
		} else {
			txr.DisableInterrupts()
		}
		n, err := epollWait(ep, evs)
		if err != nil {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for _, ev := range evs[:n] {
			switch int(ev.Fd) {
			case b.stop:
				return nil
			case b.tap:
				tapReadable = true
			case call:
				txr.DrainCall()
			}
		}
	}
}

func (b *bridge) reclaimTX() error {
	for {
		u, ok, err := b.tx.PopUsed()
		if !ok {
			return nil
		}
		if err != nil {
			b.stats.DeviceErrors.Add(1)
			return err
		}
		b.tx.Put(uint16(u.ID))
	}
}

// rxLoop: back-end → guest. Used RX buffers are written to the TAP as they
// are (virtio-net header first) and posted again at once, or, in slow-reader
// mode, held until a timer fires every slowRX.
func (b *bridge) rxLoop() error {
	rxr := b.rx.Ring()
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

	size := int(rxr.Size())
	held := make([]uint16, 0, size)
	frame := make([]uint16, 0, size) // used heads of the frame being assembled (MRG_RXBUF)
	frameLens := make([]uint32, 0, size)
	want := 0
	iov := make([]unix.Iovec, size)
	armed := false

	for {
		id, ok := b.rx.Get()
		if !ok {
			break
		}
		b.rx.Post(id, 0)
	}
	if _, err := b.rx.Publish(); err != nil {
		return err
	}
	for {
		reposted := 0
		for {
			u, ok, err := b.rx.PopUsed()
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
					want = int(binary.LittleEndian.Uint16(b.rx.Buf(id)[10:12]))
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
			b.writeFrame(frame, frameLens, iov)
			for _, h := range frame {
				if b.slowRX > 0 {
					held = append(held, h)
				} else {
					b.rx.Post(h, 0)
					reposted++
				}
			}
			frame, frameLens = frame[:0], frameLens[:0]
		}
		if reposted > 0 {
			if _, err := b.rx.Publish(); err != nil {
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
		n, err := epollWait(ep, evs)
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
					b.rx.Post(h, 0)
				}
				held = held[:0]
				if _, err := b.rx.Publish(); err != nil {
					return err
				}
			}
		}
	}
}

// writeFrame writes one received frame (header included) to the TAP from
// the guest buffers themselves: write(2) for one buffer, writev(2) for a
// merged one. A DATA_VALID frame is first made acceptable to the TAP the
// way a virtio guest would take it (trustDataValid).
func (b *bridge) writeFrame(heads []uint16, lens []uint32, iov []unix.Iovec) {
	frameLen := -b.hdrLen
	for _, l := range lens {
		frameLen += int(l)
	}
	if trustDataValid(b.rx.Buf(heads[0])[:lens[0]], b.hdrLen, frameLen) {
		b.stats.RXDataValid.Add(1)
	}
	var total uint64
	var err error
	if len(heads) == 1 {
		buf := b.rx.Buf(heads[0])[:lens[0]]
		total = uint64(len(buf))
		_, err = unix.Write(b.tap, buf)
	} else {
		n := 0
		for i, h := range heads {
			if lens[i] == 0 {
				continue
			}
			buf := b.rx.Buf(h)
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
}

package virtqueue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Kick, call and error eventfds come from the front-end, and a descriptor
// passed over a socket shares its open file description with the sender:
// O_NONBLOCK lives there, and the front-end can clear it again on its copy
// at any moment (fcntl). A plain read then blocks while the counter is 0,
// and a plain write while it is at its maximum (0xfffffffffffffffe), which
// the front-end can also arrange. Neither may happen on an event loop or on
// the control goroutine, so eventfds are never read or written plainly:
//
//   - Reads use preadv2 with RWF_NOWAIT, non-blocking per call whatever the
//     file's flags (eventfds honour it since Linux 5.12).
//   - Writes have no per-call equivalent (pwritev2 RWF_NOWAIT is
//     EOPNOTSUPP on an eventfd), so the kernel signals the eventfd for us:
//     a Linux AIO poll request on the eventfd itself (an eventfd is always
//     readable or writable, so it completes inside io_submit), with
//     IOCB_FLAG_RESFD naming the same eventfd. Completion signals it with
//     eventfd_signal(), which adds 1 and saturates at the maximum instead
//     of sleeping. It is one io_submit per signal where a write was one
//     write. The completion events are reaped in batches when the context's
//     ring is full.
//   - Without AIO (kernel without CONFIG_AIO, aio-max-nr exhausted, a
//     seccomp filter refusing it) writes fall back to poll-then-write and
//     reads without RWF_NOWAIT to a plain read of a non-blocking fd. A
//     front-end that clears O_NONBLOCK and races us can then block the
//     thread; vhostuser bounds every stop with a deadline and drains the
//     eventfds of a pair that does not stop (ClearEventfd), which wakes a
//     blocked writer.

// eventfdIO is a queue's eventfd I/O state: the buffers and the AIO
// request live here so the hot path allocates nothing. It is used by one
// goroutine at a time, like the queue.
type eventfdIO struct {
	buf  [8]byte
	iov  unix.Iovec
	aio  aioRequest
	init bool
}

func (e *eventfdIO) setup() {
	if !e.init {
		e.iov.Base = &e.buf[0]
		e.iov.SetLen(len(e.buf))
		e.init = true
	}
}

// noWaitReads is cleared when preadv2(RWF_NOWAIT) is refused (kernel
// before 5.12, seccomp): reads fall back to plain reads.
var noWaitReads atomic.Bool

func init() { noWaitReads.Store(true) }

// read reads fd's counter without blocking: 0 when it is zero.
func (e *eventfdIO) read(fd int) (uint64, error) {
	e.setup()
	for {
		var n int
		var err error
		if noWaitReads.Load() {
			n, err = preadv2NoWait(fd, &e.iov)
			if err == unix.EOPNOTSUPP || err == unix.ENOSYS || err == unix.EPERM {
				noWaitReads.Store(false)
				continue
			}
		} else {
			n, err = unix.Read(fd, e.buf[:])
		}
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, nil
		case err != nil:
			return 0, fmt.Errorf("read eventfd %d: %w", fd, err)
		case n != 8:
			// Only an eventfd reads 8 bytes; vhostuser accepts no other.
			return 0, fmt.Errorf("read eventfd %d: %d bytes: %w", fd, n, errNotEventfd)
		}
		return binary.LittleEndian.Uint64(e.buf[:]), nil
	}
}

var errNotEventfd = errors.New("not an eventfd")

func preadv2NoWait(fd int, iov *unix.Iovec) (int, error) {
	// Offset -1: the file position (an eventfd has none to move). Raw:
	// RWF_NOWAIT never sleeps, and a loop keeps its P through the call
	// (tcpstack/hostsock/raw_syscall.go).
	n, _, e := unix.RawSyscall6(unix.SYS_PREADV2, uintptr(fd), uintptr(unsafe.Pointer(iov)), 1,
		^uintptr(0), ^uintptr(0), unix.RWF_NOWAIT)
	if e != 0 {
		return int(n), e
	}
	return int(n), nil
}

// signal adds 1 to fd's counter without blocking. A counter already at its
// maximum means the reader has not looked yet, which is as good.
func (e *eventfdIO) signal(fd int) error {
	err, _ := e.signalPair(fd, nil, -1)
	return err
}

// signalPair is signal for fd and, when o is not nil, for o's ofd too,
// both with one io_submit (SignalPending). It returns each one's error.
func (e *eventfdIO) signalPair(fd int, o *eventfdIO, ofd int) (err, oerr error) {
	e.setup()
	done := 0
	if ctx := aioCtx.Load(); ctx != 0 {
		var aerr error
		if o == nil {
			if aerr = e.aio.signal(ctx, fd); aerr == nil {
				done = 1
			}
		} else {
			done, aerr = e.aio.signalTwo(ctx, fd, &o.aio, ofd)
		}
		switch {
		case aerr == nil:
		case aerr == unix.ENOSYS || aerr == unix.EPERM:
			// Refused outright: a seccomp filter installed after the
			// context was made. Every queue falls back.
			disableAIO(aerr)
		case aerr == unix.EAGAIN:
			// The ring stayed full after reaping (other threads
			// signalling at once): this one signal falls back.
		default:
			err = fmt.Errorf("signal eventfd %d: %w", fd, aerr)
			if o != nil {
				oerr = fmt.Errorf("signal eventfd %d: %w", ofd, aerr)
			}
			return err, oerr
		}
	}
	if done < 1 {
		err = e.pollWrite(fd)
	}
	switch {
	case o == nil:
	case done == 1:
		// The ring had one slot: the second goes alone, through AIO.
		o.setup()
		oerr = o.signal(ofd)
	case done == 0:
		o.setup()
		oerr = o.pollWrite(ofd)
	}
	return err, oerr
}

// pollWrite is the fallback: write only when poll says the counter has
// room. A front-end that fills the counter between the two calls, with
// O_NONBLOCK cleared, can block the write (see above).
func (e *eventfdIO) pollWrite(fd int) error {
	pfd := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(pfd[:], 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll eventfd %d: %w", fd, err)
		}
		if n == 0 || pfd[0].Revents&unix.POLLOUT == 0 {
			return nil // counter full: a signal is pending
		}
		break
	}
	binary.LittleEndian.PutUint64(e.buf[:], 1)
	for {
		_, err := unix.Write(fd, e.buf[:])
		switch {
		case err == unix.EINTR:
			continue
		case err == nil, err == unix.EAGAIN:
			return nil
		default:
			return fmt.Errorf("write eventfd %d: %w", fd, err)
		}
	}
}

// aioCtx is the process's AIO context for eventfd signals (0: none). One
// context serves every queue: io_setup/io_destroy cost an RCU grace period
// (tens of milliseconds) each, too much per queue rebuild, and submitting
// from several threads to one context is safe. It lives as long as the
// process.
var (
	aioCtx     atomic.Uintptr
	aioOnce    sync.Once
	aioLogOnce sync.Once
	aioErr     error
)

// setupAIO creates the AIO context once; log hears why it could not be.
func setupAIO(log *slog.Logger) {
	aioOnce.Do(func() {
		ctx, err := aioSetup()
		if err != nil {
			aioErr = err
			return
		}
		aioCtx.Store(ctx)
	})
	if aioErr != nil {
		if log == nil {
			log = slog.Default()
		}
		aioLogOnce.Do(func() {
			log.Warn("virtqueue: Linux AIO unavailable; eventfd signals fall back to poll-then-write, "+
				"which a hostile front-end can block (stops still have a deadline)", "err", aioErr)
		})
	}
}

// disableAIO switches every queue to the fallback after io_submit itself
// was refused.
func disableAIO(error) { aioCtx.Store(0) }

// ClearEventfd reads and discards an eventfd's counter without blocking,
// whatever the file's flags. A writer blocked on a full counter wakes up.
// vhostuser uses it on the call and error eventfds of a pair that does not
// stop in time.
func ClearEventfd(fd int) error {
	var e eventfdIO
	_, err := e.read(fd)
	return err
}

//go:build linux && (amd64 || arm64)

package virtqueue

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Linux AIO ABI (include/uapi/linux/aio_abi.h), little-endian layout.
const (
	iocbCmdPoll   = 5
	iocbFlagResfd = 1 << 0
	aioRingEvents = 128 // requested (counted against fs.aio-max-nr); the kernel rounds up
)

type iocb struct {
	data      uint64
	key       uint32
	rwFlags   int32
	opcode    uint16
	reqprio   int16
	fildes    uint32
	buf       uint64
	nbytes    uint64
	offset    int64
	reserved2 uint64
	flags     uint32
	resfd     uint32
}

type ioEvent struct {
	data, obj uint64
	res, res2 int64
}

// aioRequest is one queue's reusable poll request and the pointer array
// io_submit takes (its own request, and another queue's with signalTwo).
// Both are in the queue's (heap) memory, which the kernel reads during
// io_submit only.
type aioRequest struct {
	cb  iocb
	cbp [2]uintptr
}

// pollSignal is the poll request that signals fd (see signal).
func pollSignal(fd int) iocb {
	return iocb{
		opcode: iocbCmdPoll,
		fildes: uint32(fd),
		buf:    uint64(unix.POLLIN | unix.POLLOUT),
		flags:  iocbFlagResfd,
		resfd:  uint32(fd),
	}
}

// signal submits a poll of fd for POLLIN|POLLOUT with fd as its resfd: the
// request completes inside io_submit and the completion adds 1 to fd's
// counter (saturating). EAGAIN (no free slot: completions not reaped)
// reaps and retries.
func (r *aioRequest) signal(ctx uintptr, fd int) error {
	r.cb = pollSignal(fd)
	_, err := r.submit(ctx, nil)
	return err
}

// signalTwo signals rfd and, with the same io_submit, sfd through s's
// request. It returns how many of the two it signalled: after 1, sfd's is
// still to do.
func (r *aioRequest) signalTwo(ctx uintptr, rfd int, s *aioRequest, sfd int) (int, error) {
	r.cb, s.cb = pollSignal(rfd), pollSignal(sfd)
	return r.submit(ctx, s)
}

// submit submits r's request, and s's after it when s is not nil.
// EAGAIN (no free slot: completions not reaped) reaps and retries.
func (r *aioRequest) submit(ctx uintptr, s *aioRequest) (int, error) {
	want := uintptr(1)
	if s != nil {
		want = 2
	}
	var err error
	for try := 0; try < 3; try++ {
		// Set right before the call: nothing between here and the
		// system call can move r or s (heap objects).
		r.cbp[0] = uintptr(unsafe.Pointer(&r.cb))
		if s != nil {
			r.cbp[1] = uintptr(unsafe.Pointer(&s.cb))
		}
		// A raw call: IOCB_CMD_POLL on an eventfd never sleeps, and a
		// loop keeps its P through it (tcpstack/hostsock/raw_syscall.go).
		n, _, e := unix.RawSyscall(unix.SYS_IO_SUBMIT, ctx, want, uintptr(unsafe.Pointer(&r.cbp[0])))
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			aioReap(ctx)
			err = e
			continue
		case e != 0:
			return 0, e
		case n < 1 || n > want:
			return 0, fmt.Errorf("io_submit took %d of %d requests", n, want)
		}
		return int(n), nil
	}
	return 0, err
}

// aioReap discards the completion events in the ring, which frees their
// request slots. Several threads may reap at once; io_getevents takes the
// context's lock.
func aioReap(ctx uintptr) {
	var evs [128]ioEvent
	var zero unix.Timespec
	for {
		// Raw: a zero timeout never sleeps (see io_submit above).
		n, _, e := unix.RawSyscall6(unix.SYS_IO_GETEVENTS, ctx, 0, uintptr(len(evs)),
			uintptr(unsafe.Pointer(&evs[0])), uintptr(unsafe.Pointer(&zero)), 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 || int(n) < len(evs) {
			return
		}
	}
}

// aioSetup makes the context and checks that this kernel polls eventfds
// through AIO (IOCB_CMD_POLL, Linux 4.18) and signals a resfd, on an eventfd
// of its own.
func aioSetup() (uintptr, error) {
	var ctx uintptr
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, aioRingEvents, uintptr(unsafe.Pointer(&ctx)), 0); e != 0 {
		return 0, fmt.Errorf("io_setup: %w", e)
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Syscall(unix.SYS_IO_DESTROY, ctx, 0, 0)
		return 0, fmt.Errorf("eventfd: %w", err)
	}
	defer unix.Close(fd)
	r := new(aioRequest)
	if err := r.signal(ctx, fd); err != nil {
		unix.Syscall(unix.SYS_IO_DESTROY, ctx, 0, 0)
		return 0, fmt.Errorf("io_submit poll with resfd: %w", err)
	}
	var b [8]byte
	if n, err := unix.Read(fd, b[:]); err != nil || n != 8 || b != [8]byte{1} {
		unix.Syscall(unix.SYS_IO_DESTROY, ctx, 0, 0)
		return 0, fmt.Errorf("AIO completion did not signal its eventfd (%d bytes %x, %v)", n, b, err)
	}
	aioReap(ctx)
	return ctx, nil
}

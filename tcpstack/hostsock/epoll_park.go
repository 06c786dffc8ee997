package hostsock

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Parker waits for an Epoll's events by parking the goroutine in the Go
// netpoller, where the epoll instance itself is registered (an epoll
// descriptor is readable while it has events ready).
//
// The difference from a blocking epoll_wait is the runtime's monitor
// thread, sysmon. It ticks — a nanosleep of up to 10 ms, a context switch
// each — for as long as any P is busy, and a goroutine in a system call,
// or in a raw one the runtime does not see, keeps its P busy. Parked in
// the netpoller, the goroutine leaves its P idle; with every P idle,
// sysmon sleeps until a P is busy in a system call again. Under a QEMU
// guest's download that monitor accounted for a third of the event loop's
// context switches (about 130 a second against 350 wake-ups). The event
// loop's own system calls on the data path are raw for the same reason
// (rawcall.go): each ordinary one, made while sysmon sleeps, wakes it.
//
// The wake-up itself costs the same thread no more than epoll_wait did:
// the thread that parked the goroutine sleeps in the runtime's epoll_wait
// and runs the goroutine when it wakes. The cost is a second epoll_wait,
// the one that reads the events, and a pass through the scheduler.
//
// A Parker belongs to one goroutine.
type Parker struct {
	ep     *Epoll
	file   *os.File // a duplicate of the epoll descriptor, in the netpoller
	raw    syscall.RawConn
	events []unix.EpollEvent
	n      int
	err    error
	step   func(uintptr) bool // p.read, bound once (a method value per call allocates)
}

// NewParker registers a duplicate of e's descriptor with the netpoller.
// Close releases it; e stays open.
func NewParker(e *Epoll) (*Parker, error) {
	fd, err := unix.FcntlInt(uintptr(e.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup epoll fd: %w", err)
	}
	// os.NewFile puts a descriptor in the netpoller only if it is
	// non-blocking; epoll_wait ignores the flag.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("epoll fd non-blocking: %w", err)
	}
	p := &Parker{ep: e, file: os.NewFile(uintptr(fd), "epoll")}
	if p.raw, err = p.file.SyscallConn(); err != nil {
		p.file.Close()
		return nil, fmt.Errorf("epoll raw conn: %w", err)
	}
	// Deadlines work exactly on descriptors in the netpoller.
	if err := p.file.SetReadDeadline(time.Time{}); err != nil {
		p.file.Close()
		return nil, fmt.Errorf("epoll fd not in the netpoller: %w", err)
	}
	p.step = p.read
	return p, nil
}

// read is RawConn.Read's callback: it takes what is ready without waiting
// and asks to park when nothing is.
func (p *Parker) read(uintptr) bool {
	for {
		n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(p.ep.fd), uintptr(unsafe.Pointer(&p.events[0])),
			uintptr(len(p.events)), 0, 0, 0)
		switch errno {
		case 0:
			p.n = int(n)
			return n > 0
		case unix.EINTR:
			continue
		default:
			p.err = errno
			return true
		}
	}
}

// Wait parks the goroutine until e has events and stores them in events.
func (p *Parker) Wait(events []unix.EpollEvent) (int, error) {
	if len(events) == 0 {
		return 0, unix.EINVAL
	}
	p.events, p.n, p.err = events, 0, nil
	if err := p.raw.Read(p.step); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return 0, unix.EBADF
		}
		return 0, fmt.Errorf("wait in the netpoller: %w", err)
	}
	p.events = nil
	return p.n, p.err
}

// Close takes the duplicate out of the netpoller and closes it. Closing a
// nil Parker does nothing.
func (p *Parker) Close() error {
	if p == nil || p.file == nil {
		return nil
	}
	err := p.file.Close()
	p.file = nil
	return err
}

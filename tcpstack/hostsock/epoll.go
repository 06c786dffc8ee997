package hostsock

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Token is the 64-bit epoll data of every fd in an event loop's set, in one
// encoding: bits 56–63 say who owns the fd (Owner), bits 32–55 are a
// generation that makes a late event for a reused slot harmless, bits 0–31
// the owner's slot (a connection, a flow, a listener, one of the loop's own
// fds).
type Token uint64

// Owner is the part of the data path an fd belongs to; the loop hands an
// event to its owner.
type Owner uint8

// Owners of the fds in a loop's epoll set.
const (
	OwnerLoop        Owner = iota // the loop's own fds (kick, wake, timer)
	OwnerUDP                      // UDP flow sockets
	OwnerICMP                     // ping sockets
	OwnerTCP                      // TCP connection sockets
	OwnerTCPListener              // forwarded TCP ports
	OwnerUDPForward               // forwarded UDP ports
)

const (
	tokenOwnerShift = 56
	tokenGenShift   = 32
	// GenMask is the bits of a generation a Token keeps.
	GenMask = 1<<(tokenOwnerShift-tokenGenShift) - 1
)

// NewToken returns the token of slot slot of owner o at generation gen
// (only its low 24 bits count).
func NewToken(o Owner, gen, slot uint32) Token {
	return Token(uint64(o)<<tokenOwnerShift | uint64(gen&GenMask)<<tokenGenShift | uint64(slot))
}

// Owner returns who the fd belongs to.
func (t Token) Owner() Owner { return Owner(t >> tokenOwnerShift) }

// Gen returns the generation (24 bits).
func (t Token) Gen() uint32 { return uint32(t>>tokenGenShift) & GenMask }

// Slot returns the owner's slot.
func (t Token) Slot() uint32 { return uint32(t) }

// EventToken returns the token of an event epoll_wait reported.
func EventToken(ev *unix.EpollEvent) Token {
	return Token(uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32)
}

// Epoll is an event loop's epoll instance.
type Epoll struct {
	fd int
}

// NewEpoll creates an epoll instance.
func NewEpoll() (*Epoll, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	return &Epoll{fd: fd}, nil
}

func (e *Epoll) ctl(op, fd int, events uint32, t Token) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(uint32(t)), Pad: int32(uint32(t >> 32))}
	return unix.EpollCtl(e.fd, op, fd, &ev)
}

// Add registers fd with events, reported with token t.
func (e *Epoll) Add(fd int, events uint32, t Token) error {
	return e.ctl(unix.EPOLL_CTL_ADD, fd, events, t)
}

// Mod changes fd's events and token.
func (e *Epoll) Mod(fd int, events uint32, t Token) error {
	return e.ctl(unix.EPOLL_CTL_MOD, fd, events, t)
}

// Del removes fd. Closing an fd removes it too; Del is for fds kept open.
func (e *Epoll) Del(fd int) error {
	return unix.EpollCtl(e.fd, unix.EPOLL_CTL_DEL, fd, nil)
}

// Wait waits up to timeout milliseconds (-1: forever, 0: not at all) for
// events and returns how many it stored in events.
func (e *Epoll) Wait(events []unix.EpollEvent, timeout int) (int, error) {
	return unix.EpollWait(e.fd, events, timeout)
}

// WaitHeld is Wait without telling the Go scheduler: the goroutine keeps
// its P through the wait, as if it were running, and the runtime neither
// hands the P to another thread nor needs one back on return. It is for an
// event loop that owns a P on purpose and bounds its waits
// (tcpstack/loop_wait.go says why); a signal, such as the runtime's
// preemption request, ends the wait early with EINTR.
func (e *Epoll) WaitHeld(events []unix.EpollEvent, timeout int) (int, error) {
	if len(events) == 0 {
		return 0, unix.EINVAL
	}
	n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(e.fd), uintptr(unsafe.Pointer(&events[0])),
		uintptr(len(events)), uintptr(timeout), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// Close closes the instance, which drops every registration; closing a
// nil or closed Epoll does nothing.
func (e *Epoll) Close() error {
	if e == nil || e.fd < 0 {
		return nil
	}
	err := unix.Close(e.fd)
	e.fd = -1
	return err
}

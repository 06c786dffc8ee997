package tcpstack

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Epoll tokens: the 64-bit epoll data of every fd in a loop's set. Bits
// 56–63 are a tag saying who owns the fd, the rest is the owner's (a flow
// slot and generation, or which of the loop's own fds).
const (
	tokenTagShift = 56
	tokenValMask  = 1<<tokenTagShift - 1
)

// Token tags.
const (
	tagLoop   uint8 = iota // the loop's own fds, value: loopFD*
	tagUDP                 // UDP flow sockets
	tagICMP                // ICMP echo (ping) sockets
	tagTCP                 // TCP flow sockets (TCPConfig.TokenTag)
	tagUDPFwd              // forwarded host UDP ports, value: listener index
)

// Values of tagLoop tokens.
const (
	loopFDWake = iota + 1
	loopFDTimer
	loopFDTXKick
	loopFDRXKick
)

func makeToken(tag uint8, v uint64) uint64 { return uint64(tag)<<tokenTagShift | v&tokenValMask }

func tokenTag(tok uint64) uint8 { return uint8(tok >> tokenTagShift) }

func eventToken(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// epollSet is a loop's epoll instance. It implements tcpPoller.
type epollSet struct {
	fd int
}

func newEpollSet() (epollSet, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return epollSet{fd: -1}, fmt.Errorf("epoll_create1: %w", err)
	}
	return epollSet{fd: fd}, nil
}

func (e epollSet) ctl(op, fd int, events uint32, token uint64) error {
	ev := unix.EpollEvent{Events: events, Fd: int32(uint32(token)), Pad: int32(uint32(token >> 32))}
	return unix.EpollCtl(e.fd, op, fd, &ev)
}

// Add registers fd with events, reported with token.
func (e epollSet) Add(fd int, events uint32, token uint64) error {
	return e.ctl(unix.EPOLL_CTL_ADD, fd, events, token)
}

// Mod changes fd's events and token.
func (e epollSet) Mod(fd int, events uint32, token uint64) error {
	return e.ctl(unix.EPOLL_CTL_MOD, fd, events, token)
}

// Del removes fd. Closing an fd removes it too; Del is for fds kept open.
func (e epollSet) Del(fd int) error {
	return unix.EpollCtl(e.fd, unix.EPOLL_CTL_DEL, fd, nil)
}

func (e *epollSet) close() {
	if e.fd >= 0 {
		unix.Close(e.fd)
		e.fd = -1
	}
}

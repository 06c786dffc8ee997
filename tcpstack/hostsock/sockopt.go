package hostsock

import (
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Socket options and queue sizes, read and set with the caller's or the
// stack's memory: x/sys/unix's wrappers allocate for some of them.

// GetInt reads an int socket option.
func GetInt(fd, level, opt int) (int, error) {
	var v int32
	l := uint32(4)
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return 0, e
	}
	return int(v), nil
}

// SetInt sets an int socket option.
func SetInt(fd, level, opt, val int) error {
	v := int32(val)
	_, _, e := unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&v)), 4, 0)
	if e != 0 {
		return e
	}
	return nil
}

// TCPInfo reads TCP_INFO into info and reports whether it could.
func TCPInfo(fd int, info *unix.TCPInfo) bool {
	l := uint32(unsafe.Sizeof(*info))
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(info)), uintptr(unsafe.Pointer(&l)), 0)
	return e == 0
}

// SendMemory reads SO_MEMINFO: the send buffer limit (sk_sndbuf) and the
// memory the send and retransmit queues take (sk_wmem_queued), both in the
// kernel's truesize accounting, the units its write checks use.
func SendMemory(fd int) (sndbuf, queued int, ok bool) {
	var m [unix.SK_MEMINFO_VARS]uint32
	l := uint32(unsafe.Sizeof(m))
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 || l <= unix.SK_MEMINFO_WMEM_QUEUED*4 {
		return 0, 0, false
	}
	return int(m[unix.SK_MEMINFO_SNDBUF]), int(m[unix.SK_MEMINFO_WMEM_QUEUED]), true
}

// SendQueued is SIOCOUTQ: bytes in a stream socket's send queue, unsent or
// unacknowledged (0 when it cannot be read).
func SendQueued(fd int) int {
	v, _ := ioctlInt(fd, unix.SIOCOUTQ)
	return v
}

// Readable is SIOCINQ on a stream socket: the bytes queued for reading
// (0 when it cannot be read).
func Readable(fd int) int {
	v, _ := ioctlInt(fd, unix.SIOCINQ)
	return v
}

// NextDatagram is SIOCINQ on a datagram socket: the size of the next
// queued datagram.
func NextDatagram(fd int) (int, error) { return ioctlInt(fd, unix.SIOCINQ) }

func ioctlInt(fd int, req uint) (int, error) {
	var v int32
	_, _, e := unix.RawSyscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(&v)))
	if e != 0 {
		return 0, e
	}
	return int(v), nil
}

// CloseWithReset closes fd so that a TCP peer sees RST, not FIN
// (SO_LINGER 0).
func CloseWithReset(fd int) {
	l := unix.Linger{Onoff: 1, Linger: 0}
	_, _, _ = unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_LINGER,
		uintptr(unsafe.Pointer(&l)), unsafe.Sizeof(l), 0)
	unix.Close(fd)
}

// peekOffset holds the SO_PEEK_OFF probe per address family ([0] AF_INET,
// [1] AF_INET6).
var peekOffset [2]struct {
	once sync.Once
	ok   bool
}

// PeekOffsetSupported probes once per address family whether TCP sockets
// of that family (AF_INET6 when v6) take SO_PEEK_OFF. The answer differs
// between families on some kernels: TCP over IPv4 gained it in Linux 6.10
// (05ea491641d3, "tcp: add support for SO_PEEK_OFF socket option"), TCP
// over IPv6 only with a later fix (2024, "tcp: add SO_PEEK_OFF socket
// option tov6"), so a kernel in between takes it on AF_INET sockets and
// refuses it (EOPNOTSUPP) on AF_INET6 ones. passt probes both families
// for the same reason.
func PeekOffsetSupported(v6 bool) bool {
	i := 0
	if v6 {
		i = 1
	}
	p := &peekOffset[i]
	p.once.Do(func() {
		fd, err := unix.Socket(family(v6), unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err != nil {
			return
		}
		p.ok = SetPeekOffset(fd, 0) == nil
		unix.Close(fd)
	})
	return p.ok
}

// SetPeekOffset sets SO_PEEK_OFF on a stream socket: MSG_PEEK reads from
// off bytes past the head of the receive queue, and the kernel moves it
// on with every peek and back with every read.
func SetPeekOffset(fd, off int) error {
	return SetInt(fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, off)
}

// SocketKind returns fd's socket type (SO_TYPE: unix.SOCK_STREAM,
// SOCK_DGRAM...) and protocol (SO_PROTOCOL: unix.IPPROTO_TCP...): what a
// descriptor received from another process is checked for before it is
// taken for a flow's socket.
func SocketKind(fd int) (typ, proto int, err error) {
	if typ, err = GetInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil {
		return 0, 0, err
	}
	if proto, err = GetInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil {
		return 0, 0, err
	}
	return typ, proto, nil
}

// SocketIsIPv6 reports whether fd is an AF_INET6 socket (SO_DOMAIN).
func SocketIsIPv6(fd int) bool {
	d, err := GetInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	return err == nil && d == unix.AF_INET6
}

// EnableGRO turns UDP_GRO on for the UDP socket fd: the kernel may then hand
// over several datagrams of one peer as one, coalesced (Batch.Segment
// says). It costs nothing when nothing coalesces; a kernel without it
// refuses, which changes nothing either.
func EnableGRO(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1) }

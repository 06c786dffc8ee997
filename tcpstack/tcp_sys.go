package tcpstack

import (
	"net/netip"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Raw system calls for host TCP sockets. x/sys/unix's convenience wrappers
// allocate (iovec arrays, sockaddrs, TCPInfo); these take the caller's
// preallocated buffers so the data path does not.

// tcpIovMax bounds the iovecs of one recvmsg/sendmsg (Linux UIO_MAXIOV).
const tcpIovMax = 1024

// tcpSysBufs is the table's scratch for system calls.
type tcpSysBufs struct {
	iov  [tcpIovMax]unix.Iovec
	msg  unix.Msghdr
	info unix.TCPInfo
}

// setIov fills b.iov from bufs (skipping empty ones) and returns the count.
func (b *tcpSysBufs) setIov(bufs [][]byte) int {
	n := 0
	for _, s := range bufs {
		if len(s) == 0 {
			continue
		}
		if n == len(b.iov) {
			break
		}
		b.iov[n].Base = &s[0]
		b.iov[n].SetLen(len(s))
		n++
	}
	return n
}

// recvPeek peeks into the first n iovecs of b.iov.
func (b *tcpSysBufs) recvPeek(fd, n int) (int, unix.Errno) {
	if n == 0 {
		return 0, 0
	}
	b.msg = unix.Msghdr{Iov: &b.iov[0]}
	b.msg.SetIovlen(n)
	for {
		r, _, e := unix.Syscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.msg)), unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(r), 0
	}
}

// send writes the first n iovecs of b.iov without raising SIGPIPE.
func (b *tcpSysBufs) send(fd, n int) (int, unix.Errno) {
	if n == 0 {
		return 0, 0
	}
	b.msg = unix.Msghdr{Iov: &b.iov[0]}
	b.msg.SetIovlen(n)
	for {
		r, _, e := unix.Syscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.msg)), unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(r), 0
	}
}

// tcpInfo reads TCP_INFO into b.info.
func (b *tcpSysBufs) tcpInfo(fd int) bool {
	l := uint32(unsafe.Sizeof(b.info))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&b.info)), uintptr(unsafe.Pointer(&l)), 0)
	return e == 0
}

// tcpDiscard drops n bytes from the front of the receive queue without
// copying them (recv with MSG_TRUNC). The kernel moves SO_PEEK_OFF back by
// the same amount.
func tcpDiscard(fd, n int) (int, unix.Errno) {
	for {
		r, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), 0, uintptr(n), unix.MSG_TRUNC|unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(r), 0
	}
}

// tcpGetsockoptInt is unix.GetsockoptInt without its allocation-free-ness
// doubts: a plain int32 on the stack.
func tcpGetsockoptInt(fd, level, opt int) (int, unix.Errno) {
	var v int32
	l := uint32(4)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&l)), 0)
	return int(v), e
}

func tcpSetsockoptInt(fd, level, opt, val int) unix.Errno {
	v := int32(val)
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&v)), 4, 0)
	return e
}

// tcpSndMem reads SO_MEMINFO: the send buffer limit (sk_sndbuf) and the
// memory the send and retransmit queues take (sk_wmem_queued), both in the
// kernel's truesize accounting, the units its write checks use.
func tcpSndMem(fd int) (sndbuf, queued int, ok bool) {
	var m [unix.SK_MEMINFO_VARS]uint32
	l := uint32(unsafe.Sizeof(m))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 || l <= unix.SK_MEMINFO_WMEM_QUEUED*4 {
		return 0, 0, false
	}
	return int(m[unix.SK_MEMINFO_SNDBUF]), int(m[unix.SK_MEMINFO_WMEM_QUEUED]), true
}

// tcpSendQueueBytes is SIOCOUTQ: bytes in the send queue, unsent or unacked.
func tcpSendQueueBytes(fd int) int {
	var v int32
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCOUTQ, uintptr(unsafe.Pointer(&v)))
	if e != 0 {
		return 0
	}
	return int(v)
}

// tcpSockaddr builds the connect() address for ap.
func tcpSockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

// tcpNewHostSocket opens a non-blocking TCP socket with TCP_NODELAY (the guest
// already decided how to segment; Nagle on top only adds latency) and the
// configured buffer pins, and starts connecting it to dst.
// inProgress is true when the connect has not completed yet.
func tcpNewHostSocket(dst netip.AddrPort, sndBuf, rcvBuf int) (fd int, inProgress bool, err error) {
	return tcpNewHostSocketFrom(dst, sndBuf, rcvBuf, nil)
}

// tcpNewHostSocketFrom is tcpNewHostSocket with a hook run on the socket
// before connect (binding a source address).
func tcpNewHostSocketFrom(dst netip.AddrPort, sndBuf, rcvBuf int, prepare func(fd int) error) (fd int, inProgress bool, err error) {
	family := unix.AF_INET
	if !dst.Addr().Is4() {
		family = unix.AF_INET6
	}
	fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, false, err
	}
	_ = tcpSetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	if sndBuf > 0 {
		_ = tcpSetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, sndBuf)
	}
	if rcvBuf > 0 {
		_ = tcpSetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf)
	}
	if prepare != nil {
		if err := prepare(fd); err != nil {
			unix.Close(fd)
			return -1, false, err
		}
	}
	err = unix.Connect(fd, tcpSockaddr(dst))
	switch err {
	case nil:
		return fd, false, nil
	case unix.EINPROGRESS, unix.EINTR:
		return fd, true, nil
	}
	unix.Close(fd)
	return -1, false, err
}

// tcpCloseWithReset closes fd so that the peer sees RST, not FIN (SO_LINGER 0).
func tcpCloseWithReset(fd int) {
	l := unix.Linger{Onoff: 1, Linger: 0}
	_, _, _ = unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_LINGER,
		uintptr(unsafe.Pointer(&l)), unsafe.Sizeof(l), 0)
	unix.Close(fd)
}

var (
	tcpPeekOffOnce sync.Once
	tcpPeekOffOK   bool
)

// tcpPeekOffsetSupported probes once whether TCP sockets take SO_PEEK_OFF
// (Linux 6.9 and later).
func tcpPeekOffsetSupported() bool {
	tcpPeekOffOnce.Do(func() {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return
		}
		tcpPeekOffOK = tcpSetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, 0) == 0
		unix.Close(fd)
	})
	return tcpPeekOffOK
}

package hostsock

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Source is where outbound host sockets are bound before they connect
// (passt's -o/--outbound), per family; an invalid address lets the routing
// table pick.
type Source struct {
	V4, V6 netip.Addr
}

// bind binds fd, a socket of the given family not yet connected, to the
// source address of that family, if any. Port 0: the kernel picks one.
func (s Source) bind(fd int, v6 bool) error {
	var sa unix.Sockaddr
	a := s.V4
	switch {
	case v6 && s.V6.Is6():
		a = s.V6
		sa = &unix.SockaddrInet6{Addr: a.As16()}
	case !v6 && s.V4.Is4():
		sa = &unix.SockaddrInet4{Addr: a.As4()}
	default:
		return nil
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fmt.Errorf("bind outbound source %v: %w", a, err)
	}
	return nil
}

// DialTCP opens a non-blocking TCP socket to dst, bound to src's address of
// dst's family, tuned as TuneTCP does, and starts connecting it.
// inProgress is true when the connect has not completed yet.
func DialTCP(dst netip.AddrPort, src Source, sndBuf, rcvBuf int) (fd int, inProgress bool, err error) {
	v6 := !dst.Addr().Is4()
	fd, err = unix.Socket(family(v6), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, false, err
	}
	TuneTCP(fd, sndBuf, rcvBuf)
	if err := src.bind(fd, v6); err != nil {
		unix.Close(fd)
		return -1, false, err
	}
	err = connect(fd, dst)
	switch err {
	case nil:
		return fd, false, nil
	case unix.EINPROGRESS, unix.EINTR:
		return fd, true, nil
	}
	unix.Close(fd)
	return -1, false, err
}

// TuneTCP sets what every translated TCP socket gets: TCP_NODELAY (the
// guest already decided how to segment; Nagle on top only adds latency)
// and, when non-zero, pinned SO_SNDBUF and SO_RCVBUF (zero leaves the
// kernel's auto-tuning alone).
func TuneTCP(fd, sndBuf, rcvBuf int) {
	_ = SetInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	if sndBuf > 0 {
		_ = SetInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, sndBuf)
	}
	if rcvBuf > 0 {
		_ = SetInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvBuf)
	}
}

// DialDatagram opens a non-blocking datagram socket of proto (0 for UDP,
// IPPROTO_ICMP or IPPROTO_ICMPV6 for a ping socket) connected to dst, bound
// to src's address of dst's family.
func DialDatagram(dst netip.AddrPort, proto int, src Source) (int, error) {
	v6 := !dst.Addr().Is4()
	fd, err := unix.Socket(family(v6), unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return -1, err
	}
	if err := src.bind(fd, v6); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := connect(fd, dst); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func family(v6 bool) int {
	if v6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

// Sockaddr converts ap for bind and connect (IPv4 addresses as AF_INET).
func Sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if a := ap.Addr(); a.Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

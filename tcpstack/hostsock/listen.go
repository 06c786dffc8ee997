package hostsock

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Forwarded host ports (passt's -t and -u): the sockets that listen on
// them, and, for UDP, the reply sockets that share their port.

// ListenTCP opens a non-blocking TCP listener on addr (port 0: the kernel
// picks), restricted to interface iface when set, and returns it with the
// port it is bound to.
func ListenTCP(addr netip.AddrPort, iface string) (fd int, port uint16, err error) {
	fd, err = forwardSocket(unix.SOCK_STREAM, addr.Addr().Is6(), iface)
	if err != nil {
		return -1, 0, err
	}
	if err := unix.Bind(fd, Sockaddr(addr)); err != nil {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("forward bind %v: %w", addr, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("forward listen: %w", err)
	}
	_, port, err = boundPort(fd)
	if err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, port, nil
}

// ListenUDP opens a non-blocking UDP socket bound to addr (port 0: the
// kernel picks), restricted to iface when set, that reply sockets may share
// (SO_REUSEADDR, see DialUDPFrom). It returns the address bound and its
// port.
func ListenUDP(addr netip.AddrPort, iface string) (fd int, local unix.Sockaddr, port uint16, err error) {
	fd, err = forwardSocket(unix.SOCK_DGRAM, addr.Addr().Is6(), iface)
	if err != nil {
		return -1, nil, 0, err
	}
	if err := unix.Bind(fd, Sockaddr(addr)); err != nil {
		unix.Close(fd)
		return -1, nil, 0, fmt.Errorf("forward bind %v: %w", addr, err)
	}
	local, port, err = boundPort(fd)
	if err != nil {
		unix.Close(fd)
		return -1, nil, 0, err
	}
	return fd, local, port, nil
}

// DialUDPFrom opens a UDP socket bound to local, the address of a
// forwarded port (ListenUDP), and connected to peer: the guest's replies
// to peer leave from the port peer sent to, and the kernel prefers this
// connected socket for peer's further datagrams.
func DialUDPFrom(local unix.Sockaddr, peer netip.AddrPort, iface string) (int, error) {
	_, v6 := local.(*unix.SockaddrInet6)
	fd, err := forwardSocket(unix.SOCK_DGRAM, v6, iface)
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(fd, local); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := connect(fd, peer); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// forwardSocket opens a non-blocking socket of typ for a forwarded port:
// SO_REUSEADDR, IPv6 only for IPv6, bound to iface when set
// (SO_BINDTODEVICE, passt's %IF; unprivileged since Linux 5.7).
func forwardSocket(typ int, v6 bool, iface string) (int, error) {
	fd, err := unix.Socket(family(v6), typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("forward socket: %w", err)
	}
	_ = SetInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if v6 {
		_ = SetInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
	}
	if iface != "" {
		if err := unix.BindToDevice(fd, iface); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("forward bind to interface %s: %w", iface, err)
		}
	}
	return fd, nil
}

// boundPort returns the address a socket is bound to and its port: the
// kernel's choice when it was bound to port 0.
func boundPort(fd int) (unix.Sockaddr, uint16, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return nil, 0, fmt.Errorf("forward getsockname: %w", err)
	}
	return sa, addrPortOf(sa).Port(), nil
}

// Accept takes one pending connection of a listener, non-blocking, and
// returns it with the peer's address (IPv4-mapped addresses unmapped).
func Accept(fd int) (int, netip.AddrPort, error) {
	cfd, sa, err := unix.Accept4(fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
	if err != nil {
		return -1, netip.AddrPort{}, err
	}
	return cfd, addrPortOf(sa), nil
}

// addrPortOf converts an AF_INET or AF_INET6 socket address (IPv4-mapped
// addresses unmapped); the zero AddrPort for anything else.
func addrPortOf(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// RawAddrPort decodes an AF_INET or AF_INET6 socket address as recvmsg
// stores it (RecvFrom), without allocating.
func RawAddrPort(sa *unix.RawSockaddrAny) (netip.AddrPort, bool) {
	switch sa.Addr.Family {
	case unix.AF_INET:
		p := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&p.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom4(p.Addr), port), true
	case unix.AF_INET6:
		p := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&p.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom16(p.Addr), port), true
	}
	return netip.AddrPort{}, false
}

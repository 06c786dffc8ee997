package hostsock

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// connect starts connecting fd to ap without allocating: unix.Connect
// takes its address as an interface whose raw form escapes to the heap,
// one allocation per translated connection or datagram flow, where the
// connection rate is a hot path. The raw address lives on the stack for
// the length of the call. IPv4 addresses connect as AF_INET, as Sockaddr.
// Every socket it connects is non-blocking, so the call does not sleep
// (raw_syscall.go).
func connect(fd int, ap netip.AddrPort) error {
	var err unix.Errno
	if a := ap.Addr(); a.Is4() {
		sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.As4()}
		putPort(&sa.Port, ap.Port())
		_, _, err = unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), unix.SizeofSockaddrInet4)
	} else {
		sa := unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()}
		putPort(&sa.Port, ap.Port())
		_, _, err = unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa)), unix.SizeofSockaddrInet6)
	}
	if err != 0 {
		return err
	}
	return nil
}

// putPort stores port in network byte order in a raw sockaddr's port.
func putPort(dst *uint16, port uint16) {
	b := (*[2]byte)(unsafe.Pointer(dst))
	b[0], b[1] = byte(port>>8), byte(port)
}

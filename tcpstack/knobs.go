package tcpstack

import (
	"fmt"
	"net/netip"

	"vunet/tcpstack/stats"

	"golang.org/x/sys/unix"
)

// Operator knobs of passt's: protocols turned off, a fixed source address
// for host sockets, forwarded ports bound to one interface.

// protocolDisabled reports (and counts) a guest packet of a protocol the
// configuration turns off.
func (l *loop) protocolDisabled(proto uint8) bool {
	cfg := &l.s.cfg
	var off bool
	switch proto {
	case ipProtoTCP:
		off = cfg.NoTCP
	case ipProtoUDP:
		off = cfg.NoUDP
	case ipProtoICMP, ipProtoICMPv6:
		off = cfg.NoICMP
	}
	if off {
		l.st.TX.Drops[stats.DropProtocolDisabled].Add(1)
	}
	return off
}

// bindSource binds a not yet connected socket of the given family to the
// configured source address of that family, if any. Port 0: the kernel
// picks the port at bind time.
func bindSource(fd int, v6 bool, bind4, bind6 netip.Addr) error {
	var sa unix.Sockaddr
	switch {
	case v6 && bind6.Is6():
		sa = &unix.SockaddrInet6{Addr: bind6.As16()}
	case !v6 && bind4.Is4():
		sa = &unix.SockaddrInet4{Addr: bind4.As4()}
	default:
		return nil
	}
	if err := unix.Bind(fd, sa); err != nil {
		a := bind4
		if v6 {
			a = bind6
		}
		return fmt.Errorf("bind outbound source %v: %w", a, err)
	}
	return nil
}

// tcpDialer returns the function the TCP table opens host sockets with:
// tcpNewHostSocket, binding to the source addresses first when set.
func tcpDialer(bind4, bind6 netip.Addr) func(dst netip.AddrPort, sndBuf, rcvBuf int) (int, bool, error) {
	if !bind4.IsValid() && !bind6.IsValid() {
		return tcpNewHostSocket
	}
	return func(dst netip.AddrPort, sndBuf, rcvBuf int) (int, bool, error) {
		return tcpNewHostSocketFrom(dst, sndBuf, rcvBuf, func(fd int) error {
			return bindSource(fd, !dst.Addr().Is4(), bind4, bind6)
		})
	}
}

// bindToDevice restricts a forwarded port's socket to one interface
// (SO_BINDTODEVICE; passt's %IF in port specifications). Unprivileged
// processes may do it since Linux 5.7.
func bindToDevice(fd int, iface string) error {
	if iface == "" {
		return nil
	}
	if err := unix.BindToDevice(fd, iface); err != nil {
		return fmt.Errorf("bind to interface %s: %w", iface, err)
	}
	return nil
}

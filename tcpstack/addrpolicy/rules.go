package addrpolicy

import "net/netip"

// The rules: how destination and source addresses are classified, and
// which of them are refused, and why.

// class4 sorts IPv4 addresses for both rule sets.
type class4 uint8

const (
	c4Unicast class4 = iota
	c4Loopback
	c4Zero // 0.0.0.0/8
	c4Multicast
	c4Broadcast // 255.255.255.255
)

func classify4(a netip.Addr) class4 {
	b := a.As4()
	switch {
	case b[0] == 127:
		return c4Loopback
	case b[0] == 0:
		return c4Zero
	case b[0] >= 224 && b[0] < 240:
		return c4Multicast
	case b == [4]byte{255, 255, 255, 255}:
		return c4Broadcast
	}
	return c4Unicast
}

// embedded4 returns the IPv4 address inside an IPv4-mapped (::ffff:0:0/96)
// or IPv4-compatible (::/96) IPv6 address; ok is false for any other
// address, ::1 and :: included.
func embedded4(a netip.Addr) (v4 netip.Addr, ok bool) {
	if !a.Is6() {
		return a, false
	}
	if a.Is4In6() {
		return a.Unmap(), true
	}
	b := a.As16()
	if [12]byte(b[:12]) != [12]byte{} || a.IsLoopback() || a.IsUnspecified() {
		return a, false
	}
	return netip.AddrFrom4([4]byte(b[12:])), true
}

func (p *Policy) dstReason(d netip.Addr) Reason {
	if d.Is4() {
		switch classify4(d) {
		case c4Loopback:
			return DstLoopback
		case c4Zero:
			return DstUnspecified
		case c4Multicast:
			return DstMulticast
		case c4Broadcast:
			return DstBroadcast
		}
		if p.bcast4.IsValid() && d == p.bcast4 {
			return DstBroadcast
		}
		return None
	}
	if !d.Is6() {
		return DstUnspecified // the zero Addr
	}
	switch {
	case d.IsLoopback():
		return DstLoopback
	case d.IsUnspecified():
		return DstUnspecified
	case d.IsMulticast():
		return DstMulticast
	}
	if v4, ok := embedded4(d); ok {
		switch classify4(v4) {
		case c4Loopback:
			return DstLoopback
		case c4Zero:
			return DstUnspecified
		}
		return DstV4Mapped
	}
	return tunnelledReason(d)
}

// tunnelledReason refuses an IPv6 address that a translator or tunnel on
// the host would turn into an IPv4 loopback or unspecified address: NAT64's
// well-known prefix (64:ff9b::/96, RFC 6052), 6to4 (2002::/16, RFC 3056)
// and Teredo (2001::/32, RFC 4380: the server, and the client stored
// inverted). Translators and the kernel should refuse those themselves;
// this does not depend on them. Other addresses of these prefixes are
// ordinary destinations.
func tunnelledReason(d netip.Addr) Reason {
	b := d.As16()
	var embedded [2][4]byte
	n := 0
	switch {
	case [12]byte(b[:12]) == [12]byte{0, 0x64, 0xff, 0x9b}:
		embedded[0], n = [4]byte(b[12:]), 1
	case b[0] == 0x20 && b[1] == 0x02:
		embedded[0], n = [4]byte(b[2:6]), 1
	case b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0:
		embedded[0] = [4]byte(b[4:8])
		embedded[1] = [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
		n = 2
	}
	for _, v4 := range embedded[:n] {
		switch classify4(netip.AddrFrom4(v4)) {
		case c4Loopback:
			return DstLoopback
		case c4Zero:
			return DstUnspecified
		}
	}
	return None
}

func (p *Policy) srcReason(s netip.Addr) Reason {
	embedded := false
	if s.Is6() {
		switch {
		case s.IsLoopback():
			return SrcLoopback
		case s.IsUnspecified():
			return SrcUnspecified
		case s.IsMulticast():
			return SrcMulticast
		}
		v4, ok := embedded4(s)
		if !ok {
			if p.linkLocal6 && s.IsLinkLocalUnicast() || p.guest6.IsValid() && p.guest6.Contains(s) {
				return None
			}
			return SrcNotGuest
		}
		// Judged by the IPv4 address inside; never the guest's IPv6 source.
		s, embedded = v4, true
	}
	if !s.Is4() {
		return SrcUnspecified // the zero Addr
	}
	switch classify4(s) {
	case c4Loopback:
		return SrcLoopback
	case c4Zero:
		return SrcUnspecified
	case c4Multicast, c4Broadcast:
		return SrcMulticast
	}
	if !embedded && p.guest4.IsValid() && s == p.guest4 {
		return None
	}
	return SrcNotGuest
}

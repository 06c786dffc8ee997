package addrpolicy

import "net/netip"

// Proto is the transport of a guest flow.
type Proto uint8

// Protocols the policy is asked about.
const (
	TCP  Proto = iota // a TCP connection (SYN or any segment without a connection)
	UDP               // a UDP flow
	ICMP              // an ICMP or ICMPv6 echo flow (ports are meaningless)
	// NumProtos is the number of protocols (array size).
	NumProtos
)

var protoNames = [NumProtos]string{"tcp", "udp", "icmp"}

// String returns the metric label value of the protocol.
func (p Proto) String() string {
	if p < NumProtos {
		return protoNames[p]
	}
	return "unknown"
}

// Config is what the policy knows about the guest's link. Addresses may be
// given in any spelling; [New] normalises them.
type Config struct {
	// Guest4 is the IPv4 address assigned to the guest, with the length of
	// its on-link prefix (unmasked: Guest4.Addr() is the address). Only
	// that address is an IPv4 source of the guest's; the prefix gives the
	// directed broadcast address. Invalid: no IPv4 source is the guest's.
	Guest4 netip.Prefix
	// Guest6 is the IPv6 prefix given to the guest, unmasked like Guest4
	// (Guest6.Addr() is the address DHCPv6 assigns). Every address in the
	// prefix is the guest's (SLAAC, privacy addresses). Invalid: none.
	Guest6 netip.Prefix
	// LinkLocal6 makes fe80::/10 sources the guest's (IPv6 is on).
	LinkLocal6 bool

	// Gateway4 is the guest's IPv4 gateway (us).
	Gateway4 netip.Addr
	// Gateway6 is the link-local router address the guest uses for us.
	Gateway6 netip.Addr
	// Gateway6Global is the host's own IPv6 router address, which a guest
	// may also use for the gateway. Invalid: none.
	Gateway6Global netip.Addr

	// MapGateway sends flows to a gateway address to the host's loopback
	// (127.0.0.1, ::1), passt's --map-host-loopback. Off, the gateway
	// address is a destination like any other.
	MapGateway bool
	// Unmapped4 and Unmapped6 keep one family's gateway unmapped although
	// MapGateway is on: passt's --no-map-gw with --map-host-loopback
	// naming the other family's gateway maps only that one.
	Unmapped4, Unmapped6 bool
	// DNSForward4 and DNSForward6, when valid, are the host resolvers that
	// TCP and UDP to a gateway address's port 53 go to, whatever
	// MapGateway says (passt's --dns-forward with --dns-host). A forward
	// of the wrong family, unspecified or multicast is ignored.
	DNSForward4, DNSForward6 netip.Addr
}

// Policy is an immutable, normalised [Config]. Its methods allocate nothing
// and are safe for concurrent use.
type Policy struct {
	guest4       netip.Addr   // the guest's IPv4 address
	bcast4       netip.Addr   // directed broadcast of its prefix, if it has one
	guest6Addr   netip.Addr   // the address DHCPv6 assigns
	guest6       netip.Prefix // masked
	linkLocal6   bool
	gw4, gw6     netip.Addr
	gw6Global    netip.Addr
	map4, map6   bool // the gateway mapping, per family
	dns4, dns6   netip.Addr
	loop4, loop6 netip.Addr
}

// New returns the policy for c. The zero Config refuses everything (no
// source is the guest's).
func New(c Config) *Policy {
	p := &Policy{
		linkLocal6: c.LinkLocal6,
		map4:       c.MapGateway && !c.Unmapped4,
		map6:       c.MapGateway && !c.Unmapped6,
		loop4:      netip.AddrFrom4([4]byte{127, 0, 0, 1}),
		loop6:      netip.IPv6Loopback(),
	}
	if a := norm(c.Guest4.Addr()); a.Is4() && c.Guest4.Bits() >= 0 && c.Guest4.Bits() <= 32 {
		p.guest4 = a
		if bits := c.Guest4.Bits(); bits <= 30 {
			b := a.As4()
			v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
			v |= 1<<(32-bits) - 1
			p.bcast4 = netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
		}
	}
	if a := c.Guest6.Addr().WithZone(""); a.Is6() && !a.Is4In6() && c.Guest6.Bits() >= 0 {
		p.guest6Addr = a
		p.guest6 = netip.PrefixFrom(a, c.Guest6.Bits()).Masked()
	}
	if a := norm(c.Gateway4); a.Is4() {
		p.gw4 = a
	}
	if a := norm(c.Gateway6); a.Is6() {
		p.gw6 = a
	}
	if a := norm(c.Gateway6Global); a.Is6() {
		p.gw6Global = a
	}
	if a := norm(c.DNSForward4); a.Is4() && usableForward(a) {
		p.dns4 = a
	}
	if a := norm(c.DNSForward6); a.Is6() && usableForward(a) {
		p.dns6 = a
	}
	return p
}

func norm(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

func usableForward(a netip.Addr) bool {
	return !a.IsUnspecified() && !a.IsMulticast() && a != broadcast4
}

var broadcast4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// Reason says why the policy refused a packet; None means it did not.
type Reason uint8

// Reasons. Metrics export them by [Reason.String]; keep the names stable.
const (
	// None: allowed.
	None Reason = iota
	// DstLoopback: to 127.0.0.0/8 or ::1, in any spelling
	// (::ffff:127.x.y.z, ::127.x.y.z).
	DstLoopback
	// DstUnspecified: to 0.0.0.0/8 or ::, in any spelling.
	DstUnspecified
	// DstV4Mapped: to another IPv4-mapped (::ffff:0:0/96) or
	// IPv4-compatible (::/96) IPv6 address.
	DstV4Mapped
	// DstMulticast: to a multicast address no service of ours answers.
	DstMulticast
	// DstBroadcast: to 255.255.255.255 or the guest prefix's broadcast.
	DstBroadcast
	// DstLinkLocal: to an IPv6 link-local address that is not the
	// gateway's mapping (the host has no socket on the guest's link).
	DstLinkLocal
	// SrcLoopback: from a loopback address, in any spelling.
	SrcLoopback
	// SrcUnspecified: from 0.0.0.0/8 or :: (outside DHCP, DHCPv6, NDP).
	SrcUnspecified
	// SrcMulticast: from a multicast or broadcast address.
	SrcMulticast
	// SrcNotGuest: from an address that is not the guest's.
	SrcNotGuest
	// NumReasons is the number of reasons, None included (array size).
	NumReasons
)

var reasonNames = [NumReasons]string{
	None:           "none",
	DstLoopback:    "dst_loopback",
	DstUnspecified: "dst_unspecified",
	DstV4Mapped:    "dst_v4_mapped",
	DstMulticast:   "dst_multicast",
	DstBroadcast:   "dst_broadcast",
	DstLinkLocal:   "dst_link_local",
	SrcLoopback:    "src_loopback",
	SrcUnspecified: "src_unspecified",
	SrcMulticast:   "src_multicast",
	SrcNotGuest:    "src_not_guest",
}

// String returns the metric label value of the reason.
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Routine reports whether guests send such packets in normal operation
// (multicast and broadcast chatter: mDNS, SSDP, LLMNR...), so a refusal is
// worth a debug line rather than a warning.
func (r Reason) Routine() bool { return r == DstMulticast || r == DstBroadcast }

// Verdict is the policy's answer for one guest flow.
type Verdict struct {
	// Reason is None when the flow may be opened.
	Reason Reason
	// Host is where the host socket connects when allowed: the guest's
	// destination, or the loopback address or DNS resolver a gateway
	// address maps to. ICMP verdicts carry port 0.
	Host netip.AddrPort
	// DNSForward is set when Host is the DNS forward's resolver (a
	// gateway address's port 53 with a DNS forward configured).
	DNSForward bool
}

// Allowed reports whether the flow may be opened.
func (v Verdict) Allowed() bool { return v.Reason == None }

// Outbound decides on a guest flow of proto from src to dst, as the
// addresses appear in the guest's IP header (both of the header's family).
// Destination rules are checked before source rules.
func (p *Policy) Outbound(proto Proto, src netip.Addr, dst netip.AddrPort) Verdict {
	d := dst.Addr().WithZone("")
	if r := p.dstReason(d); r != None {
		return Verdict{Reason: r}
	}
	if r := p.srcReason(src.WithZone("")); r != None {
		return Verdict{Reason: r}
	}
	port := dst.Port()
	if proto == ICMP {
		port = 0
	}
	h, dns := p.hostAddr(proto, d, port)
	if h.Is6() && h.IsLinkLocalUnicast() {
		return Verdict{Reason: DstLinkLocal}
	}
	return Verdict{Host: netip.AddrPortFrom(h, port), DNSForward: dns}
}

// hostAddr is the address a host socket uses for destination d (a plain
// IPv4 or IPv6 unicast address by now); dns: it is the DNS forward's.
func (p *Policy) hostAddr(proto Proto, d netip.Addr, port uint16) (h netip.Addr, dns bool) {
	var fwd, loop netip.Addr
	var mapped bool
	switch {
	case d.Is4() && p.gw4.IsValid() && d == p.gw4:
		fwd, loop, mapped = p.dns4, p.loop4, p.map4
	case d.Is6() && (p.gw6.IsValid() && d == p.gw6 || p.gw6Global.IsValid() && d == p.gw6Global):
		fwd, loop, mapped = p.dns6, p.loop6, p.map6
	default:
		return d, false
	}
	if port == 53 && proto != ICMP && fwd.IsValid() {
		return fwd, true
	}
	if mapped {
		return loop, false
	}
	return d, false
}

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

// InboundSource returns the address a host peer of a forwarded port
// appears from to the guest: the peer's own address, or the gateway of its
// family when the peer is on the host's loopback or uses the guest's own
// address (the host's, by default), which the guest could not answer. ok is
// false when no such address exists: no gateway of that family, or a peer
// that is unspecified or multicast. The result is of the unmapped peer's
// family.
func (p *Policy) InboundSource(peer netip.Addr) (netip.Addr, bool) {
	a := norm(peer)
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a == broadcast4 {
		return netip.Addr{}, false
	}
	own := a.IsLoopback() ||
		a.Is4() && p.guest4.IsValid() && a == p.guest4 ||
		a.Is6() && p.guest6Addr.IsValid() && a == p.guest6Addr
	if !own {
		return a, true
	}
	gw := p.gw4
	if a.Is6() {
		gw = p.gw6
	}
	return gw, gw.IsValid()
}

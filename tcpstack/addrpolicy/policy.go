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

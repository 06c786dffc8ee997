package linksvc

import (
	"net/netip"

	"vunet/tcpstack/header"
)

// Router Advertisement parameters.
const (
	// raRouterLifetime is the default-router lifetime in seconds, RFC 4861's
	// maximum; the loop's periodic RA refreshes it long before expiry.
	raRouterLifetime = 9000
	// raCurHopLimit is the hop limit we suggest to the guest.
	raCurHopLimit = 64
	// raDNSLifetime is the RDNSS/DNSSL lifetime: the resolvers do not
	// change while we run.
	raDNSLifetime = 0xffffffff
	// minIPv6MTU is the smallest link MTU IPv6 allows (RFC 8200 5).
	minIPv6MTU = 1280
)

// ndpService answers the guest's Neighbor and Router Solicitations. Like
// passt, it resolves every address to our MAC except the guest's own, and
// advertises itself (from the gateway's link-local address) as the default
// router, with the guest's prefix for SLAAC and M/O flags so that DHCPv6 is
// used as well.
type ndpService struct {
	cfg *AddrConfig
}

// answer answers one guest frame: a Neighbor Solicitation with a Neighbor
// Advertisement, a Router Solicitation with a Router Advertisement. It
// returns the reply's length in out and which advertisement it is, or 0
// for no reply (other messages, hop limit not 255, malformed options,
// duplicate-address probes for anything but our own address, IPv6 or NDP
// disabled).
func (s ndpService) answer(p *header.Packet, frame, out []byte) (n int, r Reply) {
	cfg := s.cfg
	if cfg == nil || cfg.Disable6 || cfg.NoNDP {
		return 0, ReplyNone
	}
	if p.EtherType != header.EtherTypeIPv6 || p.HopLimit != header.NDPHopLimit {
		return 0, ReplyNone // RFC 4861: anything else may come from off-link
	}
	if p.Protocol != header.IPProtocolICMPv6 || p.Fragment {
		return 0, ReplyNone
	}
	msg, err := header.ParseICMPv6(frame[p.L4Off : p.L4Off+p.L4Len])
	if err != nil || msg.Code() != 0 {
		return 0, ReplyNone
	}
	switch msg.Type() {
	case header.ICMPv6NeighborSolicit:
		return replied(s.neighborAdvert(p, msg, out), ReplyNeighborAdvert)
	case header.ICMPv6RouterSolicit:
		if cfg.NoRA {
			return 0, ReplyNone
		}
		rs, err := header.ParseNDPRouterSolicit(msg.Body())
		if err != nil || !header.ValidateNDPOptions(rs.Options()) {
			return 0, ReplyNone
		}
		dst, dstMAC := p.Src, p.SourceMAC()
		if dst.IsUnspecified() {
			dst, dstMAC = header.IPv6AllNodes, header.IPv6MulticastMAC(header.IPv6AllNodes.As16())
		} else if mac, ok := header.NDPLinkLayerOption(rs.Options(), header.NDPOptSourceLinkLayer); ok {
			dstMAC = mac
		}
		return replied(s.routerAdvert(out, dstMAC, dst), ReplyRouterAdvert)
	}
	return 0, ReplyNone
}

func (s ndpService) neighborAdvert(p *header.Packet, msg header.ICMPv6, out []byte) int {
	cfg := s.cfg
	ns, err := header.ParseNDPNeighborSolicit(msg.Body())
	if err != nil || !header.ValidateNDPOptions(ns.Options()) {
		return 0
	}
	target := ns.Target()
	if target.IsMulticast() || target.IsUnspecified() || target.IsLoopback() || target.Is4In6() || target == cfg.IPv6.Addr {
		return 0
	}
	router := cfg.RouterLL()
	src := p.Src
	sll, hasSLL := header.NDPLinkLayerOption(ns.Options(), header.NDPOptSourceLinkLayer)
	var dst netip.Addr
	var dstMAC header.MAC
	flags := uint8(header.NDPNAFlagRouter | header.NDPNAFlagOverride)
	if src.IsUnspecified() {
		// Duplicate address detection: stay silent so the guest can use
		// the address, unless it is trying to take our router address,
		// which we defend to all nodes (RFC 4861 7.2.4).
		if target != router || hasSLL {
			return 0
		}
		dst, dstMAC = header.IPv6AllNodes, header.IPv6MulticastMAC(header.IPv6AllNodes.As16())
	} else {
		flags |= header.NDPNAFlagSolicited
		dst, dstMAC = src, p.SourceMAC()
		if hasSLL {
			dstMAC = sll
		}
	}
	const naLen = header.ICMPv6HeaderSize + header.NDPNeighborAdvertMinimumSize + 8
	icmp, ok := svcICMPv6Space(out, naLen)
	if !ok {
		return 0
	}
	header.EncodeNDPNeighborAdvert(icmp, flags, target)
	header.EncodeNDPLinkLayerOption(icmp[naLen-8:], header.NDPOptTargetLinkLayer, cfg.OurMAC)
	// We answer as the owner of target, so the advertisement comes from it.
	return svcICMPv6Frame(out, cfg.OurMAC, dstMAC, target, dst, naLen)
}

// unsolicitedRA writes an unsolicited Router Advertisement to all nodes into
// out and returns its length, or 0 when RAs are disabled or out is too
// short. The event loop sends it on a timer and after the guest (re)starts.
func (s ndpService) unsolicitedRA(out []byte) (n int) {
	cfg := s.cfg
	if cfg == nil || cfg.Disable6 || cfg.NoNDP || cfg.NoRA {
		return 0
	}
	return s.routerAdvert(out, header.IPv6MulticastMAC(header.IPv6AllNodes.As16()), header.IPv6AllNodes)
}

func (s ndpService) routerAdvert(out []byte, dstMAC header.MAC, dst netip.Addr) int {
	cfg := s.cfg
	icmp, ok := svcICMPv6Space(out, 0)
	if !ok {
		return 0
	}
	f := header.NDPRouterAdvertFields{CurHopLimit: raCurHopLimit}
	hasAddr := cfg.IPv6.Addr.Is6() && !cfg.IPv6.Addr.Is4In6() && cfg.IPv6.PrefixLen > 0
	if !cfg.NoDHCPv6 {
		f.Flags = header.NDPRAFlagOther
		if hasAddr {
			f.Flags |= header.NDPRAFlagManaged
		}
	}
	if hasAddr {
		// Without a global address there is nothing to route to: stay a
		// neighbour, not a default router.
		f.RouterLifetime = raRouterLifetime
	}
	n := header.EncodeNDPRouterAdvert(icmp, &f)
	if n == 0 {
		return 0
	}
	if hasAddr {
		pflags := uint8(header.NDPPrefixFlagOnLink)
		if cfg.IPv6.PrefixLen == 64 { // SLAAC needs a /64
			pflags |= header.NDPPrefixFlagAutonomous
		}
		pn := header.EncodeNDPPrefixInfo(icmp[n:], cfg.Prefix6(), pflags, header.NDPInfiniteLifetime, header.NDPInfiniteLifetime)
		if pn == 0 {
			return 0
		}
		n += pn
	}
	mtu := uint32(max(cfg.EffectiveMTU(), minIPv6MTU))
	if m := header.EncodeNDPMTU(icmp[n:], mtu); m != 0 {
		n += m
	} else {
		return 0
	}
	if len(cfg.DNS6) > 0 {
		n += header.EncodeNDPRDNSS(icmp[n:], raDNSLifetime, cfg.DNS6...)
	}
	if len(cfg.Search) > 0 {
		n += header.EncodeNDPDNSSL(icmp[n:], raDNSLifetime, cfg.Search)
	}
	m := header.EncodeNDPLinkLayerOption(icmp[n:], header.NDPOptSourceLinkLayer, cfg.OurMAC)
	if m == 0 {
		return 0
	}
	n += m
	return svcICMPv6Frame(out, cfg.OurMAC, dstMAC, cfg.RouterLL(), dst, n)
}

// svcIPv6HeadersSize is Ethernet + fixed IPv6 header.
const svcIPv6HeadersSize = header.EthernetMinimumSize + header.IPv6MinimumSize

// svcICMPv6Space returns the part of out after the Ethernet and IPv6
// headers, with room for at least need bytes.
func svcICMPv6Space(out []byte, need int) ([]byte, bool) {
	if len(out) < svcIPv6HeadersSize+need {
		return nil, false
	}
	return out[svcIPv6HeadersSize:], true
}

// svcICMPv6Frame fills in the Ethernet and IPv6 headers (hop limit 255, as
// NDP requires) in front of an ICMPv6 message already written at
// out[svcIPv6HeadersSize:][:msgLen], computes its checksum and returns the
// frame length.
func svcICMPv6Frame(out []byte, srcMAC, dstMAC header.MAC, src, dst netip.Addr, msgLen int) int {
	n := svcIPv6Frame(out, srcMAC, dstMAC, src, dst, header.IPProtocolICMPv6, header.NDPHopLimit, msgLen)
	if n == 0 {
		return 0
	}
	header.ICMPv6(out[svcIPv6HeadersSize:n]).SetChecksum(src, dst)
	return n
}

// svcIPv6Frame fills in the Ethernet and IPv6 headers in front of a payload
// of payloadLen bytes already at out[svcIPv6HeadersSize:].
func svcIPv6Frame(out []byte, srcMAC, dstMAC header.MAC, src, dst netip.Addr, proto header.IPProtocol, hopLimit uint8, payloadLen int) int {
	if payloadLen > 0xffff || svcIPv6HeadersSize+payloadLen > len(out) {
		return 0
	}
	header.EncodeEthernet(out, dstMAC, srcMAC, header.EtherTypeIPv6)
	header.EncodeIPv6(out[header.EthernetMinimumSize:], &header.IPv6Fields{
		PayloadLength: uint16(payloadLen), NextHeader: proto, HopLimit: hopLimit, Source: src, Destination: dst,
	})
	return svcIPv6HeadersSize + payloadLen
}

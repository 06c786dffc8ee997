package linksvc

import "vunet/tcpstack/header"

// Reply says what a service's answer was, so the caller can count leases
// and advertisements without parsing the frame it was just handed.
type Reply uint8

// What an answer was.
const (
	// ReplyNone: no reply (n is 0).
	ReplyNone Reply = iota
	// ReplyOther: a reply the kinds below do not cover (an ARP reply, a
	// DHCP OFFER or NAK, a DHCPv6 ADVERTISE...).
	ReplyOther
	// ReplyLease: a DHCP ACK or DHCPv6 REPLY that hands the guest its
	// address.
	ReplyLease
	// ReplyRouterAdvert: a Router Advertisement.
	ReplyRouterAdvert
	// ReplyNeighborAdvert: a Neighbor Advertisement.
	ReplyNeighborAdvert
)

// replied is (n, r), or (0, ReplyNone) when nothing was built.
func replied(n int, r Reply) (int, Reply) {
	if n <= 0 {
		return 0, ReplyNone
	}
	return n, r
}

// Link is the guest link's services as one event loop uses them: answers
// to ARP, DHCP, DHCPv6 and NDP, and the announcements the loop makes on its
// own. It reads the AddrConfig it was made with, which must not change
// while the loop runs; it keeps no state and does not allocate.
//
// Every answer method takes the frame's Packet (header.ParseFrame) and the
// whole frame it was parsed from, writes a reply frame (Ethernet onward)
// into out and returns its length, 0 for none.
type Link struct {
	arp    arpService
	dhcp   dhcpService
	dhcpv6 dhcpv6Service
	ndp    ndpService
}

// New returns the services answering from cfg.
func New(cfg *AddrConfig) *Link {
	return &Link{arp: arpService{cfg}, dhcp: dhcpService{cfg}, dhcpv6: dhcpv6Service{cfg}, ndp: ndpService{cfg}}
}

// ARP answers an ARP request for any address on the link but the guest's
// own with our MAC (see arpService).
func (l *Link) ARP(p *header.Packet, frame, out []byte) (int, Reply) {
	return l.arp.answer(p, frame, out)
}

// DHCP answers a DHCPv4 client (see dhcpService).
func (l *Link) DHCP(p *header.Packet, frame, out []byte) (int, Reply) {
	return l.dhcp.answer(p, frame, out)
}

// DHCPv6 answers a DHCPv6 client (see dhcpv6Service).
func (l *Link) DHCPv6(p *header.Packet, frame, out []byte) (int, Reply) {
	return l.dhcpv6.answer(p, frame, out)
}

// NDP answers Neighbor and Router Solicitations (see ndpService).
func (l *Link) NDP(p *header.Packet, frame, out []byte) (int, Reply) {
	return l.ndp.answer(p, frame, out)
}

// GratuitousARP writes a gratuitous ARP request for the gateway (sender =
// target = the gateway address, from our MAC, broadcast) into out and
// returns its length, or 0 when IPv4 is off or there is no gateway: after
// a migration or reconnection it replaces a stale gateway MAC the guest
// may hold.
func (l *Link) GratuitousARP(out []byte) int { return l.arp.gratuitousARP(out) }

// RouterAdvert writes an unsolicited Router Advertisement to all nodes into
// out and returns its length, or 0 when IPv6, NDP or RAs are off or out is
// too short.
func (l *Link) RouterAdvert(out []byte) int { return l.ndp.unsolicitedRA(out) }

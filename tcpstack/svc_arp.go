package tcpstack

import (
	"net/netip"

	"vunet/tcpstack/header"
)

// arpFrameSize is an Ethernet header plus an IPv4-over-Ethernet ARP packet.
const arpFrameSize = header.EthernetMinimumSize + header.ARPSize

// ARPService answers the guest's ARP requests. Like passt, it claims every
// IPv4 address on the link except the guest's own: all of the guest's
// traffic must reach us whatever next hop it picked, and answering for the
// guest's address would make its duplicate-address probe fail.
//
// One ARPService belongs to one event loop; Handle is not safe for
// concurrent use because it records the guest's MAC.
type ARPService struct {
	// Config is read-only while the service runs.
	Config *AddrConfig
	// GuestMAC is the sender MAC of the last ARP packet from the guest;
	// zero until one arrived.
	GuestMAC header.MAC
}

// Handle answers one guest frame. It returns the length of the ARP reply
// written to out, or 0 when the frame needs no reply (not an ARP request,
// an announcement, a request for the guest's own address, IPv4 disabled, or
// out shorter than 42 bytes).
func (s *ARPService) Handle(frame []byte, out []byte) (n int) {
	cfg := s.Config
	if cfg == nil || cfg.Disable4 || len(out) < arpFrameSize {
		return 0
	}
	eth, err := header.ParseEthernet(frame)
	if err != nil || eth.Type() != header.EtherTypeARP {
		return 0
	}
	req, err := header.ParseARP(eth.Payload())
	if err != nil {
		return 0
	}
	sha := req.SenderMAC()
	if !sha.IsMulticast() && !sha.IsZero() {
		s.GuestMAC = sha
	}
	if req.Op() != header.ARPRequest {
		return 0
	}
	sip, tip := req.SenderIP(), req.TargetIP()
	// An announcement (target = sender) tells, it does not ask. Probes from
	// 0.0.0.0 are answered unless they are for the guest's own address: the
	// guest must not pick an address that we route elsewhere.
	if tip == sip || tip == cfg.IPv4.Addr {
		return 0
	}
	dst := sha
	if dst.IsMulticast() || dst.IsZero() {
		dst = eth.Source()
	}
	header.EncodeEthernet(out, dst, cfg.OurMAC, header.EtherTypeARP)
	header.EncodeARP(out[header.EthernetMinimumSize:], header.ARPReply, cfg.OurMAC, tip, sha, sip)
	return arpFrameSize
}

// GratuitousARP writes a gratuitous ARP request (sender = target = the
// gateway address, from our MAC, broadcast) into out and returns its
// length, or 0 if IPv4 is disabled or out is too short. Sending it after a
// migration or reconnection refreshes a guest neighbour cache that may hold
// a stale MAC for the gateway.
func (s *ARPService) GratuitousARP(out []byte) (n int) {
	cfg := s.Config
	if cfg == nil || cfg.Disable4 || !cfg.IPv4.Gateway.Is4() || len(out) < arpFrameSize {
		return 0
	}
	gw := cfg.IPv4.Gateway
	header.EncodeEthernet(out, header.BroadcastMAC, cfg.OurMAC, header.EtherTypeARP)
	header.EncodeARP(out[header.EthernetMinimumSize:], header.ARPRequest, cfg.OurMAC, gw, header.MAC{}, gw)
	return arpFrameSize
}

// BuildRARPAnnouncement writes the frame QEMU's announce-self sends for
// VHOST_USER_SEND_RARP (a broadcast RARP "request reverse" with mac as both
// hardware addresses and zero protocol addresses) into out and returns its
// length, or 0 when out is too short. Switches learn from it where mac now
// lives; on our single-guest link it is what a back-end emits when asked to
// announce the guest.
func BuildRARPAnnouncement(out []byte, mac header.MAC) (n int) {
	if len(out) < arpFrameSize {
		return 0
	}
	header.EncodeEthernet(out, header.BroadcastMAC, mac, header.EtherTypeRARP)
	header.EncodeARP(out[header.EthernetMinimumSize:], header.RARPRequest, mac, netip.IPv4Unspecified(), mac, netip.IPv4Unspecified())
	return arpFrameSize
}

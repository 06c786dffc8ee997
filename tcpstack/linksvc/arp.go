package linksvc

import (
	"vunet/tcpstack/header"
)

// arpFrameSize is an Ethernet header plus an IPv4-over-Ethernet ARP packet.
const arpFrameSize = header.EthernetMinimumSize + header.ARPSize

// arpService answers the guest's ARP requests. Like passt, it claims every
// IPv4 address on the link except the guest's own: all of the guest's
// traffic must reach us whatever next hop it picked, and answering for the
// guest's address would make its duplicate-address probe fail.
type arpService struct {
	cfg *AddrConfig
}

// answer answers one guest frame. It returns the length of the ARP reply
// written to out, or 0 when the frame needs no reply (not an ARP request,
// an announcement, a request for the guest's own address, IPv4 disabled, or
// out shorter than 42 bytes).
func (s arpService) answer(p *header.Packet, frame, out []byte) (int, Reply) {
	cfg := s.cfg
	if cfg == nil || cfg.Disable4 || len(out) < arpFrameSize || p.EtherType != header.EtherTypeARP {
		return 0, ReplyNone
	}
	req, err := header.ParseARP(frame[header.EthernetMinimumSize:])
	if err != nil {
		return 0, ReplyNone
	}
	sha := req.SenderMAC()
	if req.Op() != header.ARPRequest {
		return 0, ReplyNone
	}
	sip, tip := req.SenderIP(), req.TargetIP()
	// An announcement (target = sender) tells, it does not ask. Probes from
	// 0.0.0.0 are answered unless they are for the guest's own address: the
	// guest must not pick an address that we route elsewhere.
	if tip == sip || tip == cfg.IPv4.Addr {
		return 0, ReplyNone
	}
	dst := sha
	if dst.IsMulticast() || dst.IsZero() {
		dst = p.SourceMAC()
	}
	header.EncodeEthernet(out, dst, cfg.OurMAC, header.EtherTypeARP)
	header.EncodeARP(out[header.EthernetMinimumSize:], header.ARPReply, cfg.OurMAC, tip, sha, sip)
	return arpFrameSize, ReplyOther
}

// gratuitousARP writes a gratuitous ARP request (sender = target = the
// gateway address, from our MAC, broadcast) into out and returns its
// length, or 0 if IPv4 is disabled or out is too short. Sending it after a
// migration or reconnection refreshes a guest neighbour cache that may hold
// a stale MAC for the gateway.
func (s arpService) gratuitousARP(out []byte) (n int) {
	cfg := s.cfg
	if cfg == nil || cfg.Disable4 || !cfg.IPv4.Gateway.Is4() || len(out) < arpFrameSize {
		return 0
	}
	gw := cfg.IPv4.Gateway
	header.EncodeEthernet(out, header.BroadcastMAC, cfg.OurMAC, header.EtherTypeARP)
	header.EncodeARP(out[header.EthernetMinimumSize:], header.ARPRequest, cfg.OurMAC, gw, header.MAC{}, gw)
	return arpFrameSize
}

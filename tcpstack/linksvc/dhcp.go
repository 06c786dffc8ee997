package linksvc

import (
	"net/netip"
	"strings"

	"vunet/tcpstack/header"
)

// DHCP reply sizing.
const (
	// dhcpv4HeadersSize is Ethernet + IPv4 + UDP in front of a DHCP reply.
	dhcpv4HeadersSize = header.EthernetMinimumSize + header.IPv4MinimumSize + header.UDPMinimumSize
	// dhcpv4DefaultMaxMessage is the message size every client must accept
	// (RFC 2131 2: 576-byte IP datagrams).
	dhcpv4DefaultMaxMessage = 576 - header.IPv4MinimumSize - header.UDPMinimumSize
	// dhcpv4InfiniteLease is the lease time we grant: the address is the
	// host's and never moves to another client.
	dhcpv4InfiniteLease = 0xffffffff
	// svcTTL is the TTL / hop limit of frames the services originate.
	svcTTL = 64
)

var ipv4Broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// dhcpService is a DHCPv4 server for the one guest on the link. It offers
// AddrConfig's IPv4 address with an infinite lease, the gateway as router
// and server identifier, the resolvers, search list and MTU. It keeps no
// lease state: any client on the link gets the same address, as in passt.
type dhcpService struct {
	cfg *AddrConfig
}

// dhcpv4Reply describes the reply being built.
type dhcpv4Reply struct {
	msgType     header.DHCPv4MessageType
	rapidCommit bool
	withSearch  bool
}

// answer answers one guest frame: DISCOVER with OFFER (ACK with Rapid
// Commit when the client asked for it), REQUEST with ACK or, for an address
// other than the guest's, NAK, INFORM with ACK. It returns the length of the
// reply frame written to out, 0 for no reply, and ReplyLease for an ACK
// that hands out the address.
func (s dhcpService) answer(p *header.Packet, frame, out []byte) (n int, r Reply) {
	cfg := s.cfg
	if cfg == nil || cfg.Disable4 || cfg.NoDHCP || !cfg.IPv4.Addr.Is4() {
		return 0, ReplyNone
	}
	if p.EtherType != header.EtherTypeIPv4 || p.Fragment || p.Protocol != header.IPProtocolUDP {
		return 0, ReplyNone
	}
	udp, err := header.ParseUDP(frame[p.L4Off : p.L4Off+p.L4Len])
	if err != nil || udp.DestinationPort() != header.DHCPv4ServerPort {
		return 0, ReplyNone
	}
	req, err := header.ParseDHCPv4(udp.Payload())
	if err != nil || req.Op() != header.DHCPv4OpRequest || req.HardwareType() != 1 || req.HardwareLen() != 6 {
		return 0, ReplyNone
	}
	if sid, ok := req.OptionAddr(header.DHCPv4OptServerID); ok && sid != s.serverID() {
		return 0, ReplyNone // the client is talking to another server
	}
	var rep dhcpv4Reply
	_, rapid := req.Option(header.DHCPv4OptRapidCommit)
	switch req.MessageType() {
	case header.DHCPDiscover:
		rep.msgType = header.DHCPOffer
		if rapid {
			rep.msgType, rep.rapidCommit = header.DHCPAck, true
		}
	case header.DHCPRequest:
		want, ok := req.OptionAddr(header.DHCPv4OptRequestedIP)
		if !ok {
			want = req.ClientIP() // RENEWING / REBINDING
		}
		rep.msgType = header.DHCPAck
		if want != cfg.IPv4.Addr {
			rep.msgType = header.DHCPNak
		}
	case header.DHCPInform:
		rep.msgType = header.DHCPAck
	default:
		return 0, ReplyNone // DECLINE, RELEASE and server-to-client types need no answer
	}
	rep.withSearch = true
	if n = s.build(req, &rep, out); n == 0 {
		// The search list is the only open-ended option: drop it rather
		// than the whole reply when the client's size limit is small.
		rep.withSearch = false
		n = s.build(req, &rep, out)
	}
	switch {
	case n == 0:
		return 0, ReplyNone
	case rep.msgType == header.DHCPAck && req.MessageType() != header.DHCPInform && !s.cfg.IPv4.Addr.IsUnspecified():
		return n, ReplyLease // yiaddr is the guest's address
	}
	return n, ReplyOther
}

// serverID is the address we identify as and send from: the gateway.
func (s dhcpService) serverID() netip.Addr {
	cfg := s.cfg
	if cfg.IPv4.Gateway.Is4() {
		return cfg.IPv4.Gateway
	}
	return gatewayForPrefix(netip.PrefixFrom(cfg.IPv4.Addr, cfg.IPv4.PrefixLen))
}

// maxMessage is the largest DHCP message the client accepts (option 57).
func maxMessage(req header.DHCPv4) int {
	d, ok := req.Option(header.DHCPv4OptMaxMessageSize)
	if !ok || len(d) != 2 {
		return dhcpv4DefaultMaxMessage
	}
	v := int(d[0])<<8 | int(d[1]) - header.IPv4MinimumSize - header.UDPMinimumSize
	return max(v, dhcpv4DefaultMaxMessage)
}

func (s dhcpService) build(req header.DHCPv4, r *dhcpv4Reply, out []byte) int {
	cfg := s.cfg
	if len(out) <= dhcpv4HeadersSize {
		return 0
	}
	body := out[dhcpv4HeadersSize:]
	body = body[:min(len(body), maxMessage(req))]
	inform := req.MessageType() == header.DHCPInform
	nak := r.msgType == header.DHCPNak

	f := header.DHCPv4Fields{
		Op:            header.DHCPv4OpReply,
		TransactionID: req.TransactionID(),
		Flags:         req.Flags() & header.DHCPv4BroadcastFlag,
		GatewayIP:     req.GatewayIP(),
		ClientMAC:     req.ClientMAC(),
	}
	if !nak {
		f.ClientIP = req.ClientIP()
		if !inform {
			f.YourIP = cfg.IPv4.Addr
		}
	}
	var w header.DHCPv4Builder
	w.Reset(body, &f)
	w.AddOptionByte(header.DHCPv4OptMessageType, uint8(r.msgType))
	w.AddOptionAddrs(header.DHCPv4OptServerID, s.serverID())
	if nak {
		w.AddOptionString(header.DHCPv4OptMessage, "requested address is not the guest's")
	} else {
		if r.rapidCommit {
			w.AddOption(header.DHCPv4OptRapidCommit, nil)
		}
		if !inform {
			w.AddOptionUint32(header.DHCPv4OptLeaseTime, dhcpv4InfiniteLease)
		}
		mask := netip.PrefixFrom(cfg.IPv4.Addr, cfg.IPv4.PrefixLen)
		w.AddOptionAddrs(header.DHCPv4OptSubnetMask, prefixMask4(mask.Bits()))
		if gw := cfg.IPv4.Gateway; gw.Is4() {
			w.AddOptionAddrs(header.DHCPv4OptRouter, gw)
			if !mask.Contains(gw) {
				// A gateway outside the guest's prefix (a /32 host address,
				// as clouds hand out) is unreachable through option 3
				// alone: give a host route to it, then the default route
				// (RFC 3442; clients then ignore option 3).
				g := gw.As4()
				routes := [14]byte{32, g[0], g[1], g[2], g[3], 0, 0, 0, 0, 0, g[0], g[1], g[2], g[3]}
				w.AddOption(header.DHCPv4OptClasslessRoutes, routes[:])
			}
		}
		w.AddOptionAddrs(header.DHCPv4OptDNS, cfg.DNS4...)
		w.AddOptionUint16(header.DHCPv4OptInterfaceMTU, uint16(min(max(cfg.EffectiveMTU(), 68), 65535)))
		addNameOptions(&w, cfg)
		if r.withSearch && len(cfg.Search) > 0 {
			// Option 15 for clients that only know a single domain.
			var tmp [header.MaxDomainNameLength]byte
			if name := cfg.Search[0]; header.EncodeDomainName(tmp[:], name) > 1 {
				w.AddOptionString(header.DHCPv4OptDomainName, strings.TrimSuffix(name, "."))
			}
			w.AddOptionDomainSearch(cfg.Search)
		}
	}
	msgLen, ok := w.Finish()
	if !ok {
		return 0
	}

	// RFC 2131 4.1: NAKs are broadcast; a client with an address gets
	// unicast there; one that asked for broadcast gets it; otherwise unicast
	// to the offered address at the client's MAC.
	dstMAC, dstIP := req.ClientMAC(), cfg.IPv4.Addr
	switch {
	case nak:
		dstMAC, dstIP = header.BroadcastMAC, ipv4Broadcast
	case req.ClientIP().IsValid() && !req.ClientIP().IsUnspecified():
		dstIP = req.ClientIP()
	case req.Broadcast():
		dstMAC, dstIP = header.BroadcastMAC, ipv4Broadcast
	}
	return svcUDPv4Frame(out, cfg.OurMAC, dstMAC, s.serverID(), dstIP, header.DHCPv4ServerPort, header.DHCPv4ClientPort, msgLen)
}

// prefixMask4 returns the IPv4 netmask of a prefix length.
func prefixMask4(bits int) netip.Addr {
	m := ^uint32(0) << (32 - min(max(bits, 0), 32))
	if bits <= 0 {
		m = 0
	}
	return netip.AddrFrom4([4]byte{byte(m >> 24), byte(m >> 16), byte(m >> 8), byte(m)})
}

// svcUDPv4Frame fills in the Ethernet, IPv4 and UDP headers in front of a
// payload already written at out[dhcpv4HeadersSize:][:payloadLen] and
// returns the frame length.
func svcUDPv4Frame(out []byte, srcMAC, dstMAC header.MAC, src, dst netip.Addr, srcPort, dstPort uint16, payloadLen int) int {
	udpLen := header.UDPMinimumSize + payloadLen
	ipLen := header.IPv4MinimumSize + udpLen
	if ipLen > header.IPv4MaximumPacketSize || header.EthernetMinimumSize+ipLen > len(out) {
		return 0
	}
	header.EncodeEthernet(out, dstMAC, srcMAC, header.EtherTypeIPv4)
	ipb := out[header.EthernetMinimumSize:]
	header.EncodeIPv4(ipb, &header.IPv4Fields{
		TotalLength: uint16(ipLen), TTL: svcTTL, Protocol: header.IPProtocolUDP, Source: src, Destination: dst,
	})
	udp := header.UDP(ipb[header.IPv4MinimumSize:ipLen])
	header.EncodeUDP(udp, srcPort, dstPort, uint16(udpLen))
	udp.SetChecksum(src, dst)
	return header.EthernetMinimumSize + ipLen
}

package linksvc

import (
	"bytes"

	"vunet/tcpstack/header"
)

// DHCPv6 server parameters.
const (
	// dhcpv6MaxPreference makes the client take our ADVERTISE at once
	// instead of waiting for other servers (RFC 8415 18.2.1).
	dhcpv6MaxPreference = 255
	// dhcpv6DUIDMaxLen is the longest DUID RFC 8415 11.1 allows.
	dhcpv6DUIDMaxLen = 130
)

// dhcpv6Service is a stateless-in-practice DHCPv6 server for the guest: it
// hands out AddrConfig's IPv6 address in IA_NA with infinite lifetimes,
// resolvers (option 23) and the search list (option 24), and identifies
// itself with a DUID-LL built from our MAC.
type dhcpv6Service struct {
	cfg *AddrConfig
}

// answer answers one guest frame: SOLICIT with ADVERTISE (or REPLY when the
// client asked for Rapid Commit), REQUEST, RENEW, REBIND, CONFIRM,
// INFORMATION-REQUEST, RELEASE and DECLINE with REPLY. It returns the reply
// frame's length in out, or 0 for no reply (not DHCPv6 for us, a server
// identifier that is not ours, no client identifier where one is required,
// IPv6 or DHCPv6 disabled), and ReplyLease for a REPLY that hands out the
// address.
func (s dhcpv6Service) answer(p *header.Packet, frame, out []byte) (n int, r Reply) {
	cfg := s.cfg
	if cfg == nil || cfg.Disable6 || cfg.NoDHCPv6 {
		return 0, ReplyNone
	}
	if p.EtherType != header.EtherTypeIPv6 || p.Protocol != header.IPProtocolUDP || p.Fragment {
		return 0, ReplyNone
	}
	udp, err := header.ParseUDP(frame[p.L4Off : p.L4Off+p.L4Len])
	if err != nil || udp.DestinationPort() != header.DHCPv6ServerPort {
		return 0, ReplyNone
	}
	req, err := header.ParseDHCPv6(udp.Payload())
	if err != nil {
		return 0, ReplyNone
	}

	var duid [10]byte
	header.EncodeDUIDLL(duid[:], cfg.OurMAC)
	if sid, ok := req.Option(header.DHCPv6OptServerID); ok && !bytes.Equal(sid, duid[:]) {
		return 0, ReplyNone // addressed to another server
	}
	clientID, hasClientID := req.Option(header.DHCPv6OptClientID)
	if hasClientID && (len(clientID) == 0 || len(clientID) > dhcpv6DUIDMaxLen) {
		return 0, ReplyNone
	}
	_, rapid := req.Option(header.DHCPv6OptRapidCommit)

	replyType := header.DHCPv6Reply
	giveAddr := false
	var status uint16 = header.DHCPv6StatusSuccess
	hasStatus := false
	switch req.MessageType() {
	case header.DHCPv6Solicit:
		if !rapid {
			replyType = header.DHCPv6Advertise
		}
		giveAddr = true
	case header.DHCPv6Request, header.DHCPv6Renew, header.DHCPv6Rebind:
		giveAddr = true
	case header.DHCPv6Confirm:
		// The guest's addresses are on-link only if they are ours.
		onLink, hasAddrs := s.confirmOnLink(req)
		if !hasAddrs {
			return 0, ReplyNone // RFC 8415 18.3.3: nothing to confirm, no reply
		}
		hasStatus = true
		if !onLink {
			status = header.DHCPv6StatusNotOnLink
		}
	case header.DHCPv6Release, header.DHCPv6Decline:
		hasStatus = true
	case header.DHCPv6InformationRequest:
	default:
		return 0, ReplyNone
	}
	if !hasClientID && req.MessageType() != header.DHCPv6InformationRequest {
		return 0, ReplyNone // RFC 8415 16: every other client message carries a DUID
	}

	body := out[min(len(out), svcIPv6HeadersSize+header.UDPMinimumSize):]
	var w header.DHCPv6Builder
	w.Reset(body, replyType, req.TransactionID())
	w.AddOption(header.DHCPv6OptServerID, duid[:])
	if hasClientID {
		w.AddOption(header.DHCPv6OptClientID, clientID)
	}
	if replyType == header.DHCPv6Advertise {
		w.AddOption(header.DHCPv6OptPreference, []byte{dhcpv6MaxPreference})
	}
	if rapid && req.MessageType() == header.DHCPv6Solicit {
		w.AddOption(header.DHCPv6OptRapidCommit, nil)
	}
	if hasStatus {
		w.AddStatusCode(status, "")
	}
	leased := false
	if giveAddr {
		leased = s.addIANA(&w, req)
	}
	w.AddOptionAddrs(header.DHCPv6OptDNSServers, cfg.DNS6...)
	w.AddOptionDomainList(header.DHCPv6OptDomainList, cfg.Search)
	addFQDNv6(&w, cfg)
	msgLen, ok := w.Finish()
	if !ok {
		return 0, ReplyNone
	}

	src, dst := cfg.RouterLL(), p.Src
	udpLen := header.UDPMinimumSize + msgLen
	n = svcIPv6Frame(out, cfg.OurMAC, p.SourceMAC(), src, dst, header.IPProtocolUDP, svcTTL, udpLen)
	if n == 0 {
		return 0, ReplyNone
	}
	u := header.UDP(out[svcIPv6HeadersSize:n])
	header.EncodeUDP(u, header.DHCPv6ServerPort, udp.SourcePort(), uint16(udpLen))
	u.SetChecksum(src, dst)
	if leased && replyType == header.DHCPv6Reply {
		return n, ReplyLease
	}
	return n, ReplyOther
}

// addIANA answers the client's first IA_NA with the guest's address (or
// NoAddrsAvail when we have none) and reports whether it gave the address.
// A client without IA_NA (asking only for
// prefixes or temporary addresses) gets just the configuration options.
func (s dhcpv6Service) addIANA(w *header.DHCPv6Builder, req header.DHCPv6) (leased bool) {
	cfg := s.cfg
	d, ok := req.Option(header.DHCPv6OptIANA)
	if !ok {
		return false
	}
	ia, err := header.ParseDHCPv6IANA(d)
	if err != nil {
		return false
	}
	w.BeginOption(header.DHCPv6OptIANA)
	w.WriteUint32(ia.IAID())
	if !cfg.IPv6.Addr.Is6() || cfg.IPv6.Addr.Is4In6() {
		w.WriteUint32(0)
		w.WriteUint32(0)
		w.AddStatusCode(header.DHCPv6StatusNoAddrsAvail, "no global address on this link")
		w.EndOption()
		return false
	}
	// The address never changes hands: no reason to renew, ever.
	w.WriteUint32(header.DHCPv6Infinity)
	w.WriteUint32(header.DHCPv6Infinity)
	w.BeginOption(header.DHCPv6OptIAAddr)
	w.WriteAddr(cfg.IPv6.Addr)
	w.WriteUint32(header.DHCPv6Infinity)
	w.WriteUint32(header.DHCPv6Infinity)
	w.EndOption()
	w.EndOption()
	return true
}

// confirmOnLink reports whether every address in the CONFIRM's IA_NAs is
// the guest's (RFC 8415 18.3.3), and whether there was any address at all.
func (s dhcpv6Service) confirmOnLink(req header.DHCPv6) (onLink, hasAddrs bool) {
	opts := req.Options()
	seen := false
	for i := 0; i < 64; i++ {
		code, data, rest, ok, err := header.NextDHCPv6Option(opts)
		if !ok || err != nil {
			break
		}
		opts = rest
		if code != header.DHCPv6OptIANA {
			continue
		}
		ia, err := header.ParseDHCPv6IANA(data)
		if err != nil {
			return false, seen
		}
		sub := ia.Options()
		for j := 0; j < 64; j++ {
			c, d, r, ok, err := header.NextDHCPv6Option(sub)
			if !ok || err != nil {
				break
			}
			sub = r
			if c != header.DHCPv6OptIAAddr {
				continue
			}
			a, err := header.ParseDHCPv6IAAddr(d)
			if err != nil || a.Address() != s.cfg.IPv6.Addr {
				return false, true
			}
			seen = true
		}
	}
	return seen, seen
}

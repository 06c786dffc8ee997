package header

import (
	"net/netip"
	"testing"
)

// The fuzz targets call every accessor on whatever a parser accepts: a
// parser that lets through a view too short for its accessors shows up as
// an index-out-of-range panic here.

func addSeeds(f *testing.F, hexes ...string) {
	for _, h := range hexes {
		f.Add(mustHex(f, h))
	}
}

func FuzzEthernet(f *testing.F) {
	addSeeds(f, capDHCPDiscover, capMLDv2HopByHop, capDADNS, capRS,
		"ffffffffffff5254001234568100000a0800",
		"ffffffffffff52540012345608060001080006040001525400123456c0a80002000000000000c0a80001")
	f.Fuzz(func(t *testing.T, frame []byte) {
		frame = append([]byte(nil), frame...) // accessors below may rewrite fields
		e, err := ParseEthernet(frame)
		if err != nil {
			return
		}
		_, _, _ = e.Destination().String(), e.Source().IsMulticast(), e.Payload()
		switch e.Type() {
		case EtherTypeARP:
			if a, err := ParseARP(e.Payload()); err == nil {
				_, _, _, _, _ = a.Op(), a.SenderMAC(), a.SenderIP(), a.TargetMAC(), a.TargetIP()
			}
		case EtherTypeIPv4:
			fuzzIPv4(e.Payload())
		case EtherTypeIPv6:
			fuzzIPv6(e.Payload())
		}
	})
}

func FuzzIPv4(f *testing.F) {
	addSeeds(f, capIPv4UDP, capIPv4TCPSYN, capDHCPDiscover[28:],
		"4600002000000000400100000a0000010a00000294040000080000000000000000000000")
	f.Fuzz(func(t *testing.T, b []byte) {
		b = append([]byte(nil), b...)
		fuzzIPv4(b)
	})
}

func fuzzIPv4(b []byte) {
	ip, err := ParseIPv4(b)
	if err != nil {
		return
	}
	_, _, _, _, _ = ip.TOS(), ip.ID(), ip.Flags(), ip.FragmentOffset(), ip.IsFragment()
	_, _, _, _ = ip.TTL(), ip.Checksum(), ip.Source(), ip.Destination()
	valid := ip.IsChecksumValid()
	opts := ip.Options()
	for i := 0; i < 64; i++ {
		_, _, rest, ok, err := NextIPv4Option(opts)
		if !ok || err != nil {
			break
		}
		opts = rest
	}
	if valid {
		ip.SetTTL(ip.TTL() - 1)
		if !ip.IsChecksumValid() {
			panic("SetTTL broke a valid checksum")
		}
	}
	if ip.IsFragment() {
		return
	}
	fuzzL4(ip.Protocol(), ip.Payload(), ip.Source(), ip.Destination())
}

func FuzzIPv6(f *testing.F) {
	addSeeds(f, capIPv6UDP, capIPv6TCPSYN, capMLDv2HopByHop[28:], capDADNS[28:], capRS[28:],
		"6000000000102c40fe800000000000000000000000000001fe8000000000000000000000000000021100000100000009")
	f.Fuzz(func(t *testing.T, b []byte) {
		b = append([]byte(nil), b...)
		fuzzIPv6(b)
	})
}

func fuzzIPv6(b []byte) {
	ip, err := ParseIPv6(b)
	if err != nil {
		return
	}
	_, _, _, _ = ip.TrafficClass(), ip.FlowLabel(), ip.PayloadLength(), ip.HopLimit()
	ul, err := ip.UpperLayer()
	if err != nil {
		return
	}
	if ul.Offset > len(ip) {
		panic("upper-layer offset past the packet")
	}
	if ul.Fragment && ul.FragmentOffset != 0 {
		return
	}
	fuzzL4(ul.Protocol, ip[ul.Offset:], ip.Source(), ip.Destination())
}

func fuzzL4(proto IPProtocol, b []byte, src, dst netip.Addr) {
	switch proto {
	case IPProtocolTCP:
		fuzzTCP(b, src, dst)
	case IPProtocolUDP:
		fuzzUDP(b, src, dst)
	case IPProtocolICMPv4:
		fuzzICMP(b, src, dst, false)
	case IPProtocolICMPv6:
		fuzzICMP(b, src, dst, true)
	}
}

func FuzzTCP(f *testing.F) {
	addSeeds(f, capIPv4TCPSYN[40:], capIPv6TCPSYN[80:],
		"ad6c1f901a4df48700000001b0101000000000000101050a000000010000000201030307",
		"ad6c1f901a4df4870000000050180100000000006461746121")
	f.Fuzz(func(t *testing.T, b []byte) {
		b = append([]byte(nil), b...)
		fuzzTCP(b, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"))
	})
}

func fuzzTCP(b []byte, src, dst netip.Addr) {
	tc, err := ParseTCP(b)
	if err != nil {
		return
	}
	_, _, _, _ = tc.SourcePort(), tc.DestinationPort(), tc.SequenceNumber(), tc.AckNumber()
	_, _, _, _ = tc.Flags().Has(TCPFlagSYN), tc.WindowSize(), tc.UrgentPointer(), tc.Payload()
	_ = tc.IsChecksumValid(src, dst)
	var o TCPOptions
	if ParseTCPOptions(tc.Options(), &o) != nil {
		return
	}
	// What we parsed must survive our own encoder.
	var enc [TCPMaxOptionsSize]byte
	if n := EncodeTCPOptions(enc[:], &o); n > 0 {
		var o2 TCPOptions
		if err := ParseTCPOptions(enc[:n], &o2); err != nil || o2 != o {
			panic("TCP options round trip mismatch")
		}
	}
}

func FuzzUDP(f *testing.F) {
	addSeeds(f, capIPv4UDP[40:], capIPv6UDP[80:], capDHCPDiscover[68:])
	f.Fuzz(func(t *testing.T, b []byte) {
		b = append([]byte(nil), b...)
		fuzzUDP(b, netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"))
	})
}

func fuzzUDP(b []byte, src, dst netip.Addr) {
	u, err := ParseUDP(b)
	if err != nil {
		return
	}
	_, _, _, _ = u.SourcePort(), u.DestinationPort(), u.Length(), u.Payload()
	_ = u.IsChecksumValid(src, dst)
	switch {
	case u.DestinationPort() == DHCPv4ServerPort:
		fuzzDHCP(u.Payload())
	case u.DestinationPort() == DHCPv6ServerPort:
		fuzzDHCPv6(u.Payload())
	}
	u.SetChecksum(src, dst)
	if !u.IsChecksumValid(src, dst) {
		panic("SetChecksum does not verify")
	}
}

func FuzzICMP(f *testing.F) {
	addSeeds(f, capMLDv2HopByHop[28+96:], capDADNS[28+80:], capRS[28+80:],
		"0800f7fc00010001", "8000000012340001abcd")
	f.Fuzz(func(t *testing.T, b []byte) {
		b = append([]byte(nil), b...)
		fuzzICMP(b, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), false)
		fuzzICMP(b, netip.MustParseAddr("fe80::1"), IPv6AllNodes, true)
	})
}

func fuzzICMP(b []byte, src, dst netip.Addr, v6 bool) {
	if !v6 {
		m, err := ParseICMPv4(b)
		if err != nil {
			return
		}
		_, _, _, _, _ = m.Type(), m.Code(), m.Sequence(), m.Payload(), m.IsChecksumValid()
		m.SetChecksum()
		m.SetIdent(m.Ident() + 1)
		if !m.IsChecksumValid() {
			panic("ICMPv4 SetIdent broke the checksum")
		}
		return
	}
	m, err := ParseICMPv6(b)
	if err != nil {
		return
	}
	_, _, _, _ = m.Code(), m.Sequence(), m.Payload(), m.IsChecksumValid(src, dst)
	fuzzNDP(m)
}

func FuzzNDP(f *testing.F) {
	addSeeds(f, capDADNS[28+80:], capRS[28+80:],
		"86000000"+"40c00e1000000000000000000101525400123456"+"0304"+"40c0ffffffffffffffff0000000020010db8000100000000000000000000",
		"88000000e0000000fe8000000000000000000000000000010201010203040506",
		"86000000"+"00000000000000000000000019030000ffffffff20010db800000000000000000000005300")
	f.Fuzz(func(t *testing.T, b []byte) {
		b = append([]byte(nil), b...)
		if m, err := ParseICMPv6(b); err == nil {
			fuzzNDP(m)
		}
	})
}

func fuzzNDP(m ICMPv6) {
	var opts []byte
	switch m.Type() {
	case ICMPv6RouterSolicit:
		rs, err := ParseNDPRouterSolicit(m.Body())
		if err != nil {
			return
		}
		opts = rs.Options()
	case ICMPv6RouterAdvert:
		ra, err := ParseNDPRouterAdvert(m.Body())
		if err != nil {
			return
		}
		_, _, _, _, _ = ra.CurHopLimit(), ra.Flags(), ra.RouterLifetime(), ra.ReachableTime(), ra.RetransTimer()
		opts = ra.Options()
	case ICMPv6NeighborSolicit:
		ns, err := ParseNDPNeighborSolicit(m.Body())
		if err != nil {
			return
		}
		_ = ns.Target()
		opts = ns.Options()
	case ICMPv6NeighborAdvert:
		na, err := ParseNDPNeighborAdvert(m.Body())
		if err != nil {
			return
		}
		_, _ = na.Flags(), na.Target()
		opts = na.Options()
	default:
		return
	}
	_ = ValidateNDPOptions(opts)
	_, _ = NDPLinkLayerOption(opts, NDPOptSourceLinkLayer)
	for {
		typ, body, rest, ok, err := NextNDPOption(opts)
		if !ok || err != nil {
			return
		}
		if typ == NDPOptPrefixInfo {
			if pi, err := ParseNDPPrefixInfo(body); err == nil {
				_, _, _, _, _ = pi.Prefix(), pi.Flags(), pi.ValidLifetime(), pi.PreferredLifetime(), pi.PrefixLength()
			}
		}
		opts = rest
	}
}

func FuzzDHCP(f *testing.F) {
	addSeeds(f, capDHCPDiscover[84:])
	f.Fuzz(func(t *testing.T, b []byte) {
		b = append([]byte(nil), b...)
		fuzzDHCP(b)
	})
}

func fuzzDHCP(b []byte) {
	m, err := ParseDHCPv4(b)
	if err != nil {
		return
	}
	_, _, _, _, _ = m.Op(), m.HardwareType(), m.HardwareLen(), m.Hops(), m.TransactionID()
	_, _, _, _, _ = m.Secs(), m.Broadcast(), m.ClientIP(), m.YourIP(), m.ServerIP()
	_, _, _ = m.GatewayIP(), m.ClientMAC(), m.MessageType()
	_, _ = m.OptionAddr(DHCPv4OptRequestedIP)
	_, _ = m.Option(DHCPv4OptParamRequest)
}

func FuzzDHCPv6(f *testing.F) {
	addSeeds(f, dhcpv6Solicit,
		"0b0000010001000a000300015254001234560006000400170018",
		"03aabbcc0001000a0003000152540012345600020000000a000300010203040506000300280000000100000000000000000005001820010db8000000000000000000000005ffffffffffffffff")
	f.Fuzz(func(t *testing.T, b []byte) {
		b = append([]byte(nil), b...)
		fuzzDHCPv6(b)
	})
}

func fuzzDHCPv6(b []byte) {
	m, err := ParseDHCPv6(b)
	if err != nil {
		return
	}
	_, _ = m.MessageType(), m.TransactionID()
	d, ok := m.Option(DHCPv6OptIANA)
	if !ok {
		return
	}
	ia, err := ParseDHCPv6IANA(d)
	if err != nil {
		return
	}
	_, _, _ = ia.IAID(), ia.T1(), ia.T2()
	opts := ia.Options()
	for {
		c, data, rest, ok, err := NextDHCPv6Option(opts)
		if !ok || err != nil {
			return
		}
		if c == DHCPv6OptIAAddr {
			if a, err := ParseDHCPv6IAAddr(data); err == nil {
				_, _, _, _ = a.Address(), a.PreferredLifetime(), a.ValidLifetime(), a.Options()
			}
		}
		opts = rest
	}
}

package header

import (
	"errors"
	"net/netip"
	"testing"
)

func TestCapturedIPv4(t *testing.T) {
	tests := []struct {
		name             string
		hex              string
		proto            IPProtocol
		srcPort, dstPort uint16
		payload          string
	}{
		{"udp", capIPv4UDP, IPProtocolUDP, 45213, 5353, "hello vunet"},
		{"tcp-syn", capIPv4TCPSYN, IPProtocolTCP, 44396, 8080, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Ethernet padding must be trimmed by Total Length.
			raw := append(mustHex(t, tt.hex), 0, 0, 0, 0)
			ip, err := ParseIPv4(raw)
			if err != nil {
				t.Fatal(err)
			}
			if !ip.IsChecksumValid() {
				t.Error("captured IPv4 header checksum does not verify")
			}
			if len(ip) != len(raw)-4 || int(ip.TotalLength()) != len(ip) {
				t.Errorf("len %d total %d, want %d", len(ip), ip.TotalLength(), len(raw)-4)
			}
			if ip.Protocol() != tt.proto || ip.TTL() != 64 || ip.HeaderLength() != 20 || ip.IsFragment() {
				t.Errorf("proto %d ttl %d hl %d frag %v", ip.Protocol(), ip.TTL(), ip.HeaderLength(), ip.IsFragment())
			}
			if ip.Flags() != IPv4FlagDontFragment {
				t.Errorf("flags %#x, want DF", ip.Flags())
			}
			if ip.Source() != netip.MustParseAddr("10.77.0.1") || ip.Destination() != netip.MustParseAddr("10.77.0.2") {
				t.Errorf("addresses %v -> %v", ip.Source(), ip.Destination())
			}
			// Recomputing must reproduce the kernel's checksum exactly.
			c := ip.Checksum()
			ip.SetChecksum()
			if ip.Checksum() != c {
				t.Errorf("SetChecksum %#x, kernel wrote %#x", ip.Checksum(), c)
			}
			switch tt.proto {
			case IPProtocolUDP:
				u, err := ParseUDP(ip.Payload())
				if err != nil {
					t.Fatal(err)
				}
				if !u.IsChecksumValid(ip.Source(), ip.Destination()) {
					t.Error("UDP checksum does not verify")
				}
				if u.SourcePort() != tt.srcPort || u.DestinationPort() != tt.dstPort || string(u.Payload()) != tt.payload {
					t.Errorf("ports %d->%d payload %q", u.SourcePort(), u.DestinationPort(), u.Payload())
				}
				c := u.Checksum()
				u.SetChecksum(ip.Source(), ip.Destination())
				if u.Checksum() != c {
					t.Errorf("UDP SetChecksum %#x, kernel wrote %#x", u.Checksum(), c)
				}
			case IPProtocolTCP:
				tc, err := ParseTCP(ip.Payload())
				if err != nil {
					t.Fatal(err)
				}
				checkCapturedSYN(t, tc, ip.Source(), ip.Destination(), tt.srcPort, tt.dstPort, 1460)
			}
		})
	}
}

func checkCapturedSYN(t *testing.T, tc TCP, src, dst netip.Addr, sport, dport, mss uint16) {
	t.Helper()
	if !tc.IsChecksumValid(src, dst) {
		t.Error("TCP checksum does not verify")
	}
	if tc.SourcePort() != sport || tc.DestinationPort() != dport {
		t.Errorf("ports %d->%d", tc.SourcePort(), tc.DestinationPort())
	}
	if tc.Flags() != TCPFlagSYN || !tc.Flags().Has(TCPFlagSYN) || tc.Flags().Has(TCPFlagACK) || tc.AckNumber() != 0 || tc.DataOffset() != 40 || len(tc.Payload()) != 0 {
		t.Errorf("flags %#x ack %d off %d", tc.Flags(), tc.AckNumber(), tc.DataOffset())
	}
	var o TCPOptions
	if err := ParseTCPOptions(tc.Options(), &o); err != nil {
		t.Fatal(err)
	}
	if !o.HasMSS || o.MSS != mss || !o.SACKPermitted || !o.HasTimestamps || o.TSEcr != 0 || o.TSVal == 0 || !o.HasWindowScale || o.WindowScale != 10 {
		t.Errorf("options %+v", o)
	}
	// Linux's SYN option layout is what EncodeTCPOptions produces.
	var b [40]byte
	if n := EncodeTCPOptions(b[:], &o); string(b[:n]) != string(tc.Options()) {
		t.Errorf("EncodeTCPOptions = %x, want %x", b[:n], tc.Options())
	}
	c := tc.Checksum()
	tc.SetChecksum(src, dst)
	if tc.Checksum() != c {
		t.Errorf("TCP SetChecksum %#x, kernel wrote %#x", tc.Checksum(), c)
	}
	old := tc.Checksum()
	tc.SetWindowSize(1234)
	if !tc.IsChecksumValid(src, dst) || tc.WindowSize() != 1234 {
		t.Error("SetWindowSize broke the checksum")
	}
	tc.SetChecksum(src, dst)
	_ = old
}

func TestCapturedIPv6(t *testing.T) {
	ip, err := ParseIPv6(mustHex(t, capIPv6UDP))
	if err != nil {
		t.Fatal(err)
	}
	if ip.NextHeader() != IPProtocolUDP || ip.HopLimit() != 64 || ip.PayloadLength() != 16 || ip.FlowLabel() != 0xed903 {
		t.Errorf("nh %d hl %d plen %d flow %#x", ip.NextHeader(), ip.HopLimit(), ip.PayloadLength(), ip.FlowLabel())
	}
	u, err := ParseUDP(ip.Payload())
	if err != nil {
		t.Fatal(err)
	}
	if !u.IsChecksumValid(ip.Source(), ip.Destination()) || string(u.Payload()) != "hello v6" || u.DestinationPort() != 5353 {
		t.Errorf("udp %x", []byte(u))
	}

	ip, err = ParseIPv6(mustHex(t, capIPv6TCPSYN))
	if err != nil {
		t.Fatal(err)
	}
	ul, err := ip.UpperLayer()
	if err != nil || ul.Protocol != IPProtocolTCP || ul.Offset != 40 || ul.Fragment {
		t.Fatalf("upper layer %+v %v", ul, err)
	}
	tc, err := ParseTCP(ip[ul.Offset:])
	if err != nil {
		t.Fatal(err)
	}
	checkCapturedSYN(t, tc, ip.Source(), ip.Destination(), 41644, 443, 1440)
}

func TestIPv6UpperLayerHopByHop(t *testing.T) {
	e, err := ParseEthernet(mustHex(t, capMLDv2HopByHop))
	if err != nil {
		t.Fatal(err)
	}
	if e.Type() != EtherTypeIPv6 || e.Destination() != (MAC{0x33, 0x33, 0, 0, 0, 0x16}) || e.Source().String() != "52:54:00:12:34:56" {
		t.Errorf("ethernet %v %v %v", e.Type(), e.Destination(), e.Source())
	}
	ip, err := ParseIPv6(e.Payload())
	if err != nil {
		t.Fatal(err)
	}
	ul, err := ip.UpperLayer()
	if err != nil || ul.Protocol != IPProtocolICMPv6 || ul.Offset != 48 {
		t.Fatalf("upper layer %+v %v", ul, err)
	}
	m, err := ParseICMPv6(ip[ul.Offset:])
	if err != nil {
		t.Fatal(err)
	}
	if m.Type() != ICMPv6MulticastListener2 || !m.IsChecksumValid(ip.Source(), ip.Destination()) {
		t.Errorf("type %d checksum valid %v", m.Type(), m.IsChecksumValid(ip.Source(), ip.Destination()))
	}
}

func TestIPv6UpperLayerErrors(t *testing.T) {
	base := func(next IPProtocol, ext []byte) IPv6 {
		b := make([]byte, 40+len(ext))
		EncodeIPv6(b, &IPv6Fields{PayloadLength: uint16(len(ext)), NextHeader: next, HopLimit: 64,
			Source: netip.MustParseAddr("fe80::1"), Destination: netip.MustParseAddr("fe80::2")})
		copy(b[40:], ext)
		return b
	}
	// A chain of destination-options headers longer than the bound.
	var long []byte
	for i := 0; i < IPv6MaxExtensionHeaders+1; i++ {
		long = append(long, byte(IPProtocolDestOptions), 0, 1, 4, 0, 0, 0, 0)
	}
	tests := []struct {
		name      string
		pkt       IPv6
		want      error
		proto     IPProtocol
		offset    int
		frag      bool
		fragOff   int
		moreFrags bool
	}{
		{"too-many", base(IPProtocolDestOptions, long), ErrTooManyHeaders, 0, 0, false, 0, false},
		{"truncated", base(IPProtocolRouting, []byte{6, 4, 0, 0, 0, 0, 0, 0}), ErrTruncated, 0, 0, false, 0, false},
		{"short-ext", base(IPProtocolHopByHop, []byte{6, 0}), ErrTruncated, 0, 0, false, 0, false},
		{"late-hbh", base(IPProtocolDestOptions, []byte{0, 0, 1, 4, 0, 0, 0, 0, 6, 0, 1, 4, 0, 0, 0, 0}), ErrBadOption, 0, 0, false, 0, false},
		{"first-fragment", base(IPProtocolFragment, []byte{17, 0, 0, 1, 0, 0, 0, 9}), nil, IPProtocolUDP, 48, true, 0, true},
		{"later-fragment", base(IPProtocolFragment, []byte{17, 0, 0x05, 0xc8, 0, 0, 0, 9}), nil, IPProtocolUDP, 48, true, 1480, false},
		{"no-next", base(IPProtocolNoNext, nil), nil, IPProtocolNoNext, 40, false, 0, false},
		{"ah", base(IPProtocolAH, []byte{6, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}), nil, IPProtocolTCP, 52, false, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip, err := ParseIPv6(tt.pkt)
			if err != nil {
				t.Fatal(err)
			}
			ul, err := ip.UpperLayer()
			if !errors.Is(err, tt.want) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
			if err == nil && (ul.Protocol != tt.proto || ul.Offset != tt.offset || ul.Fragment != tt.frag || ul.FragmentOffset != tt.fragOff || ul.MoreFragments != tt.moreFrags) {
				t.Errorf("got %+v", ul)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	ipv4 := mustHex(t, capIPv4UDP)
	mod := func(b []byte, i int, v byte) []byte {
		c := append([]byte(nil), b...)
		c[i] = v
		return c
	}
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"eth-short", errOf(ParseEthernet(make([]byte, 13))), ErrTruncated},
		{"eth-vlan", errOf(ParseEthernet(mustHex(t, "ffffffffffff5254001234568100000a0800"))), ErrVLAN},
		{"eth-qinq", errOf(ParseEthernet(mustHex(t, "ffffffffffff52540012345688a8000a0800"))), ErrVLAN},
		{"eth-8023", errOf(ParseEthernet(mustHex(t, "ffffffffffff5254001234560040"))), ErrNotSupported},
		{"ipv4-short", errOf(ParseIPv4(ipv4[:19])), ErrTruncated},
		{"ipv4-version", errOf(ParseIPv4(mod(ipv4, 0, 0x65))), ErrVersion},
		{"ipv4-ihl-small", errOf(ParseIPv4(mod(ipv4, 0, 0x44))), ErrBadLength},
		{"ipv4-ihl-past-total", errOf(ParseIPv4(mod(ipv4, 0, 0x4f))), ErrBadLength},
		{"ipv4-total-past-buffer", errOf(ParseIPv4(ipv4[:len(ipv4)-1])), ErrTruncated},
		{"ipv6-version", errOf(ParseIPv6(mod(mustHex(t, capIPv6UDP), 0, 0x40))), ErrVersion},
		{"ipv6-payload-past-buffer", errOf(ParseIPv6(mustHex(t, capIPv6UDP)[:50])), ErrTruncated},
		{"udp-len-small", errOf(ParseUDP([]byte{0, 1, 0, 2, 0, 7, 0, 0})), ErrBadLength},
		{"udp-len-past", errOf(ParseUDP([]byte{0, 1, 0, 2, 0, 9, 0, 0})), ErrTruncated},
		{"tcp-off-small", errOf(ParseTCP(make([]byte, 20))), ErrBadLength},
		{"tcp-off-past", errOf(ParseTCP(mod(make([]byte, 20), 12, 0x60))), ErrTruncated},
		{"icmp-short", errOf(ParseICMPv4(make([]byte, 7))), ErrTruncated},
		{"arp-ipv6", errOf(ParseARP(mustHex(t, "000186dd06100001000000000000000000000000000000000000000000000000"))), ErrNotSupported},
		{"dhcp-magic", errOf(ParseDHCPv4(make([]byte, 240))), ErrBadMagic},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, tt.want) {
			t.Errorf("%s: err %v, want %v", tt.name, tt.err, tt.want)
		}
	}
}

func errOf[T any](_ T, err error) error { return err }

func TestIPv4OptionsAndFragments(t *testing.T) {
	b := make([]byte, 64)
	opts := []byte{IPv4OptionNOP, 148, 4, 0, 0} // NOP + router alert (RFC 2113)
	opts = append(opts, 0, 0, 0)                // EOL padding to 8
	n := EncodeIPv4(b, &IPv4Fields{TotalLength: 28 + 8, ID: 7, Flags: IPv4FlagMoreFragments, FragmentOffset: 1480,
		TTL: 1, Protocol: IPProtocolUDP, Source: netip.MustParseAddr("10.0.0.1"), Destination: netip.MustParseAddr("10.0.0.2"), Options: opts})
	if n != 28 {
		t.Fatalf("EncodeIPv4 = %d", n)
	}
	ip, err := ParseIPv4(b[:36])
	if err != nil {
		t.Fatal(err)
	}
	if !ip.IsChecksumValid() || !ip.IsFragment() || !ip.MoreFragments() || ip.FragmentOffset() != 1480 || ip.ID() != 7 || len(ip.Payload()) != 8 {
		t.Errorf("fragment fields: %x", []byte(ip))
	}
	o := ip.Options()
	typ, _, o, ok, err := NextIPv4Option(o)
	if !ok || err != nil || typ != IPv4OptionNOP {
		t.Fatalf("first option %d %v %v", typ, ok, err)
	}
	typ, data, o, ok, err := NextIPv4Option(o)
	if !ok || err != nil || typ != 148 || len(data) != 2 {
		t.Fatalf("router alert %d %x %v %v", typ, data, ok, err)
	}
	if _, _, _, ok, err = NextIPv4Option(o); ok || err != nil {
		t.Fatalf("expected end of list, ok %v err %v", ok, err)
	}
	if _, _, _, _, err = NextIPv4Option([]byte{7, 1}); err == nil {
		t.Error("length 1 option accepted")
	}
	if _, _, _, _, err = NextIPv4Option([]byte{7, 9, 0}); err == nil {
		t.Error("overlong option accepted")
	}
	ip.SetTTL(9)
	if ip.TTL() != 9 || !ip.IsChecksumValid() {
		t.Error("SetTTL broke the checksum")
	}
	if EncodeIPv4(b, &IPv4Fields{Options: []byte{1}}) != 0 {
		t.Error("unaligned options accepted")
	}
}

func TestTCPOptions(t *testing.T) {
	tests := []struct {
		name string
		hex  string
		err  bool
		want TCPOptions
	}{
		{"mss-ws-clamped", "020405b4010303ff", false, TCPOptions{HasMSS: true, MSS: 1460, HasWindowScale: true, WindowScale: 14}},
		{"sack-blocks", "0101050a0000000100000002", false, TCPOptions{NumSACKBlocks: 1, SACKBlocks: [4]TCPSACKBlock{{1, 2}}}},
		{"eol-stops", "00020405b4", false, TCPOptions{}},
		{"unknown-skipped", "1e0400000204ffff", false, TCPOptions{HasMSS: true, MSS: 0xffff}},
		{"bad-mss-len", "020305", true, TCPOptions{}},
		{"zero-len", "fe00", true, TCPOptions{}},
		{"past-end", "fe08", true, TCPOptions{}},
		{"lone-kind", "02", true, TCPOptions{}},
		{"sack-odd", "05060000000000", true, TCPOptions{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o TCPOptions
			err := ParseTCPOptions(mustHex(t, tt.hex), &o)
			if (err != nil) != tt.err {
				t.Fatalf("err %v", err)
			}
			if !tt.err && o != tt.want {
				t.Errorf("got %+v want %+v", o, tt.want)
			}
		})
	}
	// Round trip with everything set, including three SACK blocks (40 bytes).
	in := TCPOptions{HasTimestamps: true, TSVal: 5, TSEcr: 6, NumSACKBlocks: 3,
		SACKBlocks: [4]TCPSACKBlock{{1, 2}, {3, 4}, {5, 6}}}
	var b [40]byte
	n := EncodeTCPOptions(b[:], &in)
	if n != 40 {
		t.Fatalf("encoded %d bytes", n)
	}
	var out TCPOptions
	if err := ParseTCPOptions(b[:n], &out); err != nil || out != in {
		t.Fatalf("round trip %+v %v", out, err)
	}
	too := TCPOptions{HasMSS: true, HasTimestamps: true, NumSACKBlocks: 3}
	if EncodeTCPOptions(b[:], &too) != 0 {
		t.Error("options over 40 bytes accepted")
	}
	// EncodeTCP pads options and sets the data offset.
	seg := make([]byte, 60)
	hl := EncodeTCP(seg, &TCPFields{SrcPort: 1, DstPort: 2, SeqNum: 3, AckNum: 4, Flags: TCPFlagSYN | TCPFlagACK, WindowSize: 5, Options: []byte{2, 4, 5, 0xb4, 1, 3, 3}})
	if hl != 28 || seg[12] != 7<<4 || seg[27] != 0 {
		t.Fatalf("EncodeTCP hl %d off %#x pad %#x", hl, seg[12], seg[27])
	}
}

func TestEncodeDomainName(t *testing.T) {
	long := ""
	for i := 0; i < 64; i++ {
		long += "a"
	}
	tests := []struct {
		name string
		want string
	}{
		{"example.com", "076578616d706c6503636f6d00"},
		{"example.com.", "076578616d706c6503636f6d00"},
		{"", "00"},
		{".", "00"},
		{"a..b", ""},
		{long + ".com", ""},
	}
	for _, tt := range tests {
		var b [300]byte
		n := EncodeDomainName(b[:], tt.name)
		if got := hexString(b[:n]); got != tt.want {
			t.Errorf("%q: got %s want %s", tt.name, got, tt.want)
		}
	}
	var small [5]byte
	if EncodeDomainName(small[:], "example.com") != 0 {
		t.Error("short buffer accepted")
	}
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	s := make([]byte, 0, 2*len(b))
	for _, c := range b {
		s = append(s, digits[c>>4], digits[c&0xf])
	}
	return string(s)
}

package linksvc

import (
	"net/netip"
	"testing"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
)

// svcTestNSFrame builds a Neighbor Solicitation from src for target, sent to
// target's solicited-node group, with or without a source link-layer option.
func svcTestNSFrame(_ *testing.T, src netip.Addr, target string, sll bool) []byte {
	return guestframe.NS(src, netip.MustParseAddr(target), sll)
}

type naWant struct {
	dstMAC header.MAC
	dst    netip.Addr
	flags  uint8
	target string
}

func TestNDPServiceNeighborSolicit(t *testing.T) {
	allNodesMAC := header.MAC{0x33, 0x33, 0, 0, 0, 1}
	tests := []struct {
		name  string
		frame func(t *testing.T) []byte
		cfg   func(c *AddrConfig)
		want  *naWant
	}{
		{"gateway-ll", func(t *testing.T) []byte { return svcTestNSFrame(t, svcTestGuestLL, "fe80::1", true) }, nil,
			&naWant{svcTestGuestMAC, svcTestGuestLL, 0xe0, "fe80::1"}},
		{"gateway-ll-no-sll", func(t *testing.T) []byte { return svcTestNSFrame(t, svcTestGuestLL, "fe80::1", false) }, nil,
			&naWant{svcTestGuestMAC, svcTestGuestLL, 0xe0, "fe80::1"}},
		{"from-global", func(t *testing.T) []byte {
			return svcTestNSFrame(t, netip.MustParseAddr("2001:db8:10::20"), "2001:db8:10::99", true)
		}, nil, &naWant{svcTestGuestMAC, netip.MustParseAddr("2001:db8:10::20"), 0xe0, "2001:db8:10::99"}},
		{"off-link-target", func(t *testing.T) []byte { return svcTestNSFrame(t, svcTestGuestLL, "2606:4700::1111", true) }, nil,
			&naWant{svcTestGuestMAC, svcTestGuestLL, 0xe0, "2606:4700::1111"}},
		{"dad-for-router-address", func(t *testing.T) []byte { return svcTestNSFrame(t, netip.IPv6Unspecified(), "fe80::1", false) }, nil,
			&naWant{allNodesMAC, header.IPv6AllNodes, 0xa0, "fe80::1"}},
		{"captured-dad-guest-ll", func(t *testing.T) []byte { return svcTestHex(t, svcTestCapDADNS) }, nil, nil},
		{"dad-guest-global", func(t *testing.T) []byte {
			return svcTestNSFrame(t, netip.IPv6Unspecified(), "2001:db8:10::20", false)
		}, nil, nil},
		{"guest-own-address", func(t *testing.T) []byte { return svcTestNSFrame(t, svcTestGuestLL, "2001:db8:10::20", true) }, nil, nil},
		{"multicast-target", func(t *testing.T) []byte { return svcTestNSFrame(t, svcTestGuestLL, "ff02::1", true) }, nil, nil},
		{"hop-limit-not-255", func(t *testing.T) []byte {
			f := svcTestNSFrame(t, svcTestGuestLL, "fe80::1", true)
			f[14+7] = 64
			return f
		}, nil, nil},
		{"zero-length-option", func(t *testing.T) []byte {
			f := svcTestNSFrame(t, svcTestGuestLL, "fe80::1", true)
			f[len(f)-7] = 0
			return f
		}, nil, nil},
		{"truncated", func(t *testing.T) []byte { return svcTestNSFrame(t, svcTestGuestLL, "fe80::1", true)[:70] }, nil, nil},
		{"no-ndp", func(t *testing.T) []byte { return svcTestNSFrame(t, svcTestGuestLL, "fe80::1", true) },
			func(c *AddrConfig) { c.NoNDP = true }, nil},
		{"ipv6-disabled", func(t *testing.T) []byte { return svcTestNSFrame(t, svcTestGuestLL, "fe80::1", true) },
			func(c *AddrConfig) { c.Disable6 = true }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := svcTestConfig()
			if tt.cfg != nil {
				tt.cfg(cfg)
			}
			s := ndpService{cfg}
			out := make([]byte, 1514)
			n := handle(s.answer, tt.frame(t), out)
			if tt.want == nil {
				if n != 0 {
					t.Fatalf("unexpected reply %x", out[:n])
				}
				return
			}
			if n != 14+40+32 {
				t.Fatalf("reply length %d", n)
			}
			eth, ip := svcTestIPv6Reply(t, out[:n], header.IPProtocolICMPv6, 255)
			target := netip.MustParseAddr(tt.want.target)
			if eth.Destination() != tt.want.dstMAC || ip.Destination() != tt.want.dst || ip.Source() != target {
				t.Errorf("addressing: %v %v -> %v", eth.Destination(), ip.Source(), ip.Destination())
			}
			m, _ := header.ParseICMPv6(ip.Payload())
			if m.Type() != header.ICMPv6NeighborAdvert || m.Code() != 0 || !m.IsChecksumValid(ip.Source(), ip.Destination()) {
				t.Errorf("icmp type %d code %d checksum %#x", m.Type(), m.Code(), m.Checksum())
			}
			na, _ := header.ParseNDPNeighborAdvert(m.Body())
			if na.Flags() != tt.want.flags || na.Target() != target || string(m[5:8]) != "\x00\x00\x00" {
				t.Errorf("flags %#x target %v", na.Flags(), na.Target())
			}
			if hexOf(na.Options()) != "02019a559a559a55" {
				t.Errorf("options %x, want only the target link-layer option", na.Options())
			}
		})
	}
}

type raWant struct {
	dstMAC   header.MAC
	dst      netip.Addr
	flags    uint8
	lifetime uint16
	// options in order, hex of the whole option (type and length included)
	options []string
}

func TestNDPServiceRouterAdvert(t *testing.T) {
	prefixOpt := "0304" + "40c0" + "ffffffff" + "ffffffff" + "00000000" + "20010db8001000000000000000000000"
	mtuOpt := "0501" + "0000" + "0000fff0"
	rdnssOpt := "1903" + "0000" + "ffffffff" + "20010db8000000000000000000000053"
	dnsslOpt := "1f05" + "0000" + "ffffffff" + "076578616d706c6503636f6d00" + "036c6162076578616d706c6503636f6d00" + "0000"
	sllOpt := "0101" + "9a559a559a55"
	allNodesMAC := header.MAC{0x33, 0x33, 0, 0, 0, 1}
	tests := []struct {
		name        string
		cfg         func(c *AddrConfig)
		unsolicited bool
		frame       string
		want        *raWant
	}{
		{"captured-rs", nil, false, svcTestCapRS,
			&raWant{svcTestGuestMAC, svcTestGuestLL, 0xc0, 9000, []string{prefixOpt, mtuOpt, rdnssOpt, dnsslOpt, sllOpt}}},
		{"unsolicited", nil, true, "",
			&raWant{allNodesMAC, header.IPv6AllNodes, 0xc0, 9000, []string{prefixOpt, mtuOpt, rdnssOpt, dnsslOpt, sllOpt}}},
		{"link-local-only", func(c *AddrConfig) { c.IPv6.Addr = netip.Addr{}; c.DNS6 = nil; c.Search = nil }, true, "",
			&raWant{allNodesMAC, header.IPv6AllNodes, 0x40, 0, []string{mtuOpt, sllOpt}}},
		{"no-dhcpv6-prefix56", func(c *AddrConfig) { c.NoDHCPv6 = true; c.IPv6.PrefixLen = 56; c.MTU = 1000 }, true, "",
			&raWant{allNodesMAC, header.IPv6AllNodes, 0, 9000, []string{
				"0304" + "3880" + "ffffffff" + "ffffffff" + "00000000" + "20010db8001000000000000000000000",
				"0501" + "0000" + "00000500", rdnssOpt, dnsslOpt, sllOpt}}},
		{"no-ra", func(c *AddrConfig) { c.NoRA = true }, false, svcTestCapRS, nil},
		{"no-ra-unsolicited", func(c *AddrConfig) { c.NoRA = true }, true, "", nil},
		{"no-ndp", func(c *AddrConfig) { c.NoNDP = true }, false, svcTestCapRS, nil},
		{"ipv6-disabled", func(c *AddrConfig) { c.Disable6 = true }, true, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := svcTestConfig()
			if tt.cfg != nil {
				tt.cfg(cfg)
			}
			s := ndpService{cfg}
			out := make([]byte, 1514)
			var n int
			if tt.unsolicited {
				n = s.unsolicitedRA(out)
			} else {
				n = handle(s.answer, svcTestHex(t, tt.frame), out)
			}
			if tt.want == nil {
				if n != 0 {
					t.Fatalf("unexpected reply %x", out[:n])
				}
				return
			}
			if n == 0 {
				t.Fatal("no RA")
			}
			eth, ip := svcTestIPv6Reply(t, out[:n], header.IPProtocolICMPv6, 255)
			if eth.Destination() != tt.want.dstMAC || ip.Destination() != tt.want.dst || ip.Source() != netip.MustParseAddr("fe80::1") {
				t.Errorf("addressing %v %v -> %v", eth.Destination(), ip.Source(), ip.Destination())
			}
			m, _ := header.ParseICMPv6(ip.Payload())
			if m.Type() != header.ICMPv6RouterAdvert || m.Code() != 0 || !m.IsChecksumValid(ip.Source(), ip.Destination()) {
				t.Fatalf("icmp type %d code %d bad checksum", m.Type(), m.Code())
			}
			ra, _ := header.ParseNDPRouterAdvert(m.Body())
			if ra.CurHopLimit() != 64 || ra.Flags() != tt.want.flags || ra.RouterLifetime() != tt.want.lifetime || ra.ReachableTime() != 0 || ra.RetransTimer() != 0 {
				t.Errorf("RA fields hop %d flags %#x lifetime %d reach %d retrans %d", ra.CurHopLimit(), ra.Flags(), ra.RouterLifetime(), ra.ReachableTime(), ra.RetransTimer())
			}
			checkOptions(t, ra.Options(), func(b []byte) ([]byte, bool, error) {
				_, _, rest, ok, err := header.NextNDPOption(b)
				return rest, ok, err
			}, tt.want.options)
		})
	}
}

func TestNDPServiceIgnoresOtherMessages(t *testing.T) {
	s := ndpService{svcTestConfig()}
	out := make([]byte, 1514)
	b := make([]byte, 200)
	// A Router Advertisement from the guest, an echo request, an NA.
	for _, typ := range []header.ICMPv6Type{header.ICMPv6RouterAdvert, header.ICMPv6EchoRequest, header.ICMPv6NeighborAdvert} {
		icmp := b[svcIPv6HeadersSize:]
		n := header.EncodeNDPRouterAdvert(icmp, &header.NDPRouterAdvertFields{})
		icmp[0] = uint8(typ)
		n = svcICMPv6Frame(b, svcTestGuestMAC, header.MAC{0x33, 0x33, 0, 0, 0, 1}, svcTestGuestLL, header.IPv6AllNodes, n)
		if handle(s.answer, b[:n], out) != 0 {
			t.Errorf("replied to ICMPv6 type %d", typ)
		}
	}
	// Short out buffers are refused, never overrun.
	rs := svcTestHex(t, svcTestCapRS)
	ns := svcTestNSFrame(t, svcTestGuestLL, "fe80::1", true)
	for _, size := range []int{0, 53, 54, 85, 100} {
		if handle(s.answer, rs, make([]byte, size)) != 0 || s.unsolicitedRA(make([]byte, size)) != 0 {
			t.Errorf("RA into %d bytes", size)
		}
		if size < 86 && handle(s.answer, ns, make([]byte, size)) != 0 {
			t.Errorf("NA into %d bytes", size)
		}
	}
}

// BenchmarkLinkServices measures one request/reply per service; every one
// must report 0 allocs/op.
func BenchmarkLinkServices(b *testing.B) {
	l := New(svcTestConfig())
	out := make([]byte, 1514)
	cases := []struct {
		name  string
		frame []byte
		h     func(*header.Packet, []byte, []byte) (int, Reply)
	}{
		{"arp", svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.20", "192.168.10.1"), l.ARP},
		{"dhcp-discover", svcTestHex(b, svcTestCapDHCPDiscover), l.DHCP},
		{"dhcpv6-solicit", svcTestDHCPv6Frame(b, svcTestSolicitRapid), l.DHCPv6},
		{"ndp-rs", svcTestHex(b, svcTestCapRS), l.NDP},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var p header.Packet
			for b.Loop() {
				// Parsed as the data path does, then answered.
				if header.ParseFrame(c.frame, len(c.frame), &p) != nil {
					b.Fatal("frame does not parse")
				}
				if n, _ := c.h(&p, c.frame, out); n == 0 {
					b.Fatal("no reply")
				}
			}
		})
	}
}

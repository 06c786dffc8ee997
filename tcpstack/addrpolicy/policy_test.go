package addrpolicy

import (
	"fmt"
	"net/netip"
	"testing"
)

var (
	guest4   = netip.MustParseAddr("10.0.2.15")
	gw4      = netip.MustParseAddr("10.0.2.2")
	guest6   = netip.MustParseAddr("2001:db8:1::15")
	gw6LL    = netip.MustParseAddr("fe80::1")
	gw6Glob  = netip.MustParseAddr("2001:db8:1::1")
	dnsHost4 = netip.MustParseAddr("127.0.0.53")
	dnsHost6 = netip.MustParseAddr("::1")
	remote4  = netip.MustParseAddr("93.184.216.34")
	remote6  = netip.MustParseAddr("2606:4700::1111")
)

// testConfig is a guest at 10.0.2.15/24 and 2001:db8:1::15/64 behind
// 10.0.2.2, fe80::1 and 2001:db8:1::1.
func testConfig(mapGW, dnsFwd bool) Config {
	c := Config{
		Guest4:         netip.PrefixFrom(guest4, 24),
		Guest6:         netip.PrefixFrom(guest6, 64),
		LinkLocal6:     true,
		Gateway4:       gw4,
		Gateway6:       gw6LL,
		Gateway6Global: gw6Glob,
		MapGateway:     mapGW,
	}
	if dnsFwd {
		c.DNSForward4, c.DNSForward6 = dnsHost4, dnsHost6
	}
	return c
}

// dstCase is one destination and what should become of it. host is the
// expected host address; a zero host with reason None means "as asked".
type dstCase struct {
	dst    string
	reason Reason
}

// Destinations refused whatever the configuration, in every spelling.
var refusedDsts = []dstCase{
	{"127.0.0.1", DstLoopback},
	{"127.9.9.9", DstLoopback},
	{"127.255.255.254", DstLoopback},
	{"::1", DstLoopback},
	{"::ffff:127.0.0.1", DstLoopback},
	{"::ffff:127.9.9.9", DstLoopback},
	{"::127.0.0.1", DstLoopback},
	{"::127.9.9.9", DstLoopback},
	{"0.0.0.0", DstUnspecified},
	{"0.1.2.3", DstUnspecified},
	{"::", DstUnspecified},
	{"::ffff:0.0.0.0", DstUnspecified},
	{"::0.0.0.2", DstUnspecified},
	{"::ffff:8.8.8.8", DstV4Mapped},
	{"::8.8.8.8", DstV4Mapped},
	{"::ffff:10.0.2.2", DstV4Mapped}, // the gateway, mapped: not the gateway
	{"::ffff:255.255.255.255", DstV4Mapped},
	{"224.0.0.251", DstMulticast},
	{"239.255.255.250", DstMulticast},
	{"ff02::fb", DstMulticast},
	{"ff05::1:3", DstMulticast},
	{"ff02::1", DstMulticast},
	{"255.255.255.255", DstBroadcast},
	{"10.0.2.255", DstBroadcast},
	// Translation and tunnel spellings whose IPv4 address is loopback or
	// unspecified: NAT64 (well-known prefix), 6to4, Teredo (server, and
	// the obfuscated client).
	{"64:ff9b::7f00:1", DstLoopback},
	{"64:ff9b::127.9.9.9", DstLoopback},
	{"64:ff9b::1", DstUnspecified},
	{"2002:7f00:1::1", DstLoopback},
	{"2002:7f09:909:1::5", DstLoopback},
	{"2002:0:1::1", DstUnspecified},
	{"2001:0:7f00:1::1", DstLoopback},
	{"2001:0:4136:e378:8000:63bf:80ff:fffe", DstLoopback},
	{"2001:0:4136:e378:8000:63bf:ffff:fffe", DstUnspecified},
	{"fe80::99", DstLinkLocal},
	{"fe80::1%eth0", DstLinkLocal}, // a zone changes nothing (gateway when mapped, see below)
}

func TestOutboundRefusedDestinations(t *testing.T) {
	for _, mapGW := range []bool{true, false} {
		for _, dns := range []bool{true, false} {
			p := New(testConfig(mapGW, dns))
			for _, proto := range []Proto{TCP, UDP, ICMP} {
				for _, port := range []uint16{53, 80} {
					for _, c := range refusedDsts {
						d := netip.MustParseAddr(c.dst)
						want := c.reason
						if d.WithZone("") == gw6LL {
							if !mapGW && !(dns && port == 53 && proto != ICMP) {
								want = DstLinkLocal
							} else {
								continue // the mapped gateway: see TestOutboundGateway
							}
						}
						src := guest4
						if d.Is6() {
							src = guest6
						}
						v := p.Outbound(proto, src, netip.AddrPortFrom(d, port))
						if v.Reason != want || v.Allowed() || v.Host.IsValid() {
							t.Errorf("map=%v dns=%v %v %v → %v:%d: got %v host %v, want %v",
								mapGW, dns, proto, src, c.dst, port, v.Reason, v.Host, want)
						}
					}
				}
			}
		}
	}
}

func TestOutboundGateway(t *testing.T) {
	lo4, lo6 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")
	type want struct {
		host   netip.Addr
		reason Reason
	}
	for _, mapGW := range []bool{true, false} {
		for _, dns := range []bool{true, false} {
			p := New(testConfig(mapGW, dns))
			for _, proto := range []Proto{TCP, UDP, ICMP} {
				for _, port := range []uint16{53, 80} {
					for _, gw := range []netip.Addr{gw4, gw6LL, gw6Glob} {
						var w want
						dnsHit := dns && port == 53 && proto != ICMP
						switch {
						case dnsHit && gw.Is4():
							w.host = dnsHost4
						case dnsHit:
							w.host = dnsHost6
						case mapGW && gw.Is4():
							w.host = lo4
						case mapGW:
							w.host = lo6
						case gw == gw6LL:
							w.reason = DstLinkLocal // reachable only through the mapping
						default:
							w.host = gw // the real gateway, not the host
						}
						src := guest4
						if gw.Is6() {
							src = guest6
						}
						v := p.Outbound(proto, src, netip.AddrPortFrom(gw, port))
						wantPort := port
						if proto == ICMP {
							wantPort = 0
						}
						got := want{v.Host.Addr(), v.Reason}
						if got != w || (v.Allowed() && v.Host.Port() != wantPort) {
							t.Errorf("map=%v dns=%v %v → %v:%d: got %v (%v), want %v (%v) port %d",
								mapGW, dns, proto, gw, port, v.Host, v.Reason, w.host, w.reason, wantPort)
						}
					}
				}
			}
		}
	}
}

// TestOutboundOneFamilyMapped: with one family's mapping off (--no-map-gw
// with --map-host-loopback naming the other family's gateway), only the
// other family's gateway reaches the host's loopback; the unmapped
// family's gateway is the real one, and its link-local address nothing.
func TestOutboundOneFamilyMapped(t *testing.T) {
	lo4, lo6 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")
	c := testConfig(true, false)
	c.Unmapped6 = true
	p := New(c)
	if v := p.Outbound(TCP, guest4, netip.AddrPortFrom(gw4, 22)); v.Host.Addr() != lo4 {
		t.Errorf("IPv4 gateway, mapped: %v (%v)", v.Host, v.Reason)
	}
	if v := p.Outbound(TCP, guest6, netip.AddrPortFrom(gw6LL, 22)); v.Reason != DstLinkLocal {
		t.Errorf("IPv6 link-local gateway, unmapped: %v (%v), want refused", v.Host, v.Reason)
	}
	if v := p.Outbound(UDP, guest6, netip.AddrPortFrom(gw6Glob, 22)); v.Host.Addr() != gw6Glob {
		t.Errorf("IPv6 gateway, unmapped: %v (%v), want the real gateway", v.Host, v.Reason)
	}
	c = testConfig(true, false)
	c.Unmapped4 = true
	p = New(c)
	if v := p.Outbound(ICMP, guest4, netip.AddrPortFrom(gw4, 0)); v.Host.Addr() != gw4 {
		t.Errorf("IPv4 gateway, unmapped: %v (%v), want the real gateway", v.Host, v.Reason)
	}
	if v := p.Outbound(TCP, guest6, netip.AddrPortFrom(gw6LL, 22)); v.Host.Addr() != lo6 {
		t.Errorf("IPv6 gateway, mapped: %v (%v)", v.Host, v.Reason)
	}
}

func TestOutboundOrdinaryDestinations(t *testing.T) {
	for _, mapGW := range []bool{true, false} {
		p := New(testConfig(mapGW, true))
		for _, proto := range []Proto{TCP, UDP, ICMP} {
			for _, d := range []string{
				"93.184.216.34", "169.254.169.254", "10.0.2.15", "10.0.2.1", "192.168.1.1",
				"2606:4700::1111", "64:ff9b::808:808", "2001:db8:1::99", "fd00::1",
				"2002:c000:204::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2",
			} {
				a := netip.MustParseAddr(d)
				src := guest4
				if a.Is6() {
					src = guest6
				}
				v := p.Outbound(proto, src, netip.AddrPortFrom(a, 53))
				if !v.Allowed() || v.Host.Addr() != a {
					t.Errorf("map=%v %v → %v: got %v (%v), want the destination itself", mapGW, proto, d, v.Host, v.Reason)
				}
			}
		}
	}
}

func TestOutboundSources(t *testing.T) {
	cases := []struct {
		src    string
		reason Reason
	}{
		{"10.0.2.15", None},
		{"127.0.0.1", SrcLoopback},
		{"127.9.9.9", SrcLoopback},
		{"0.0.0.0", SrcUnspecified},
		{"0.0.0.7", SrcUnspecified},
		{"224.0.0.1", SrcMulticast},
		{"255.255.255.255", SrcMulticast},
		{"10.0.2.16", SrcNotGuest}, // on the link, but not what we assigned
		{"10.0.2.2", SrcNotGuest},  // the gateway's own address
		{"192.0.2.1", SrcNotGuest},
		{"2001:db8:1::15", None},
		{"2001:db8:1::abcd:1234", None}, // SLAAC or privacy address in the prefix
		{"fe80::5054:ff:fe12:3456", None},
		{"::1", SrcLoopback},
		{"::ffff:127.0.0.1", SrcLoopback},
		{"::127.0.0.1", SrcLoopback},
		{"::", SrcUnspecified},
		{"::ffff:0.0.0.0", SrcUnspecified},
		{"ff02::1", SrcMulticast},
		{"::ffff:224.0.0.1", SrcMulticast},
		{"::ffff:10.0.2.15", SrcNotGuest}, // the guest's IPv4 address in an IPv6 header
		{"::10.0.2.15", SrcNotGuest},
		{"2001:db8:2::15", SrcNotGuest},
		{"fd00::15", SrcNotGuest},
	}
	for _, mapGW := range []bool{true, false} {
		p := New(testConfig(mapGW, true))
		for _, proto := range []Proto{TCP, UDP, ICMP} {
			for _, c := range cases {
				s := netip.MustParseAddr(c.src)
				for _, d := range []netip.Addr{remote4, gw4, remote6, gw6Glob} {
					if d.Is4() != s.Is4() {
						continue
					}
					v := p.Outbound(proto, s, netip.AddrPortFrom(d, 80))
					if v.Reason != c.reason {
						t.Errorf("map=%v %v %v → %v: got %v, want %v", mapGW, proto, c.src, d, v.Reason, c.reason)
					}
				}
			}
		}
	}
}

func TestOutboundFamiliesOff(t *testing.T) {
	// IPv6 off: no IPv6 source is the guest's, link-local included; no
	// IPv4 address configured: no IPv4 source either.
	p := New(Config{Guest6: netip.PrefixFrom(guest6, 64), Gateway4: gw4, MapGateway: true})
	if v := p.Outbound(TCP, netip.MustParseAddr("fe80::2"), netip.AddrPortFrom(remote6, 80)); v.Reason != SrcNotGuest {
		t.Errorf("link-local source with LinkLocal6 off: %v", v.Reason)
	}
	if v := p.Outbound(TCP, guest6, netip.AddrPortFrom(remote6, 80)); !v.Allowed() {
		t.Errorf("prefix source: %v", v.Reason)
	}
	if v := p.Outbound(UDP, guest4, netip.AddrPortFrom(gw4, 80)); v.Reason != SrcNotGuest {
		t.Errorf("IPv4 source without Guest4: %v", v.Reason)
	}
	// The zero Config refuses everything.
	z := New(Config{})
	for _, s := range []netip.Addr{guest4, guest6, netip.MustParseAddr("fe80::2"), {}} {
		if v := z.Outbound(UDP, s, netip.AddrPortFrom(remote4, 1)); v.Allowed() {
			t.Errorf("zero config allowed %v", s)
		}
	}
	if v := z.Outbound(UDP, guest4, netip.AddrPort{}); v.Reason != DstUnspecified {
		t.Errorf("zero destination: %v", v.Reason)
	}
}

func TestNewNormalises(t *testing.T) {
	// Mapped spellings in the configuration mean the IPv4 addresses; a DNS
	// forward of the wrong family or a useless address is ignored.
	p := New(Config{
		Guest4:      netip.PrefixFrom(netip.MustParseAddr("::ffff:10.0.2.15"), 24),
		Gateway4:    netip.MustParseAddr("::ffff:10.0.2.2"),
		MapGateway:  false,
		DNSForward4: netip.MustParseAddr("::ffff:192.0.2.53"),
		DNSForward6: netip.MustParseAddr("192.0.2.53"),
	})
	if v := p.Outbound(UDP, guest4, netip.AddrPortFrom(gw4, 53)); v.Host != netip.MustParseAddrPort("192.0.2.53:53") {
		t.Errorf("mapped DNS forward: %v (%v)", v.Host, v.Reason)
	}
	if v := p.Outbound(UDP, guest4, netip.AddrPortFrom(netip.MustParseAddr("10.0.2.255"), 9)); v.Reason != DstBroadcast {
		t.Errorf("broadcast of a mapped prefix: %v", v.Reason)
	}
	for _, bad := range []string{"0.0.0.0", "224.0.0.1", "255.255.255.255"} {
		q := New(Config{Guest4: netip.PrefixFrom(guest4, 24), Gateway4: gw4, DNSForward4: netip.MustParseAddr(bad)})
		if v := q.Outbound(UDP, guest4, netip.AddrPortFrom(gw4, 53)); v.Host.Addr() != gw4 {
			t.Errorf("DNS forward %s: host %v, want the gateway itself", bad, v.Host)
		}
	}
	// A /31 or /32 has no broadcast address.
	q := New(Config{Guest4: netip.PrefixFrom(guest4, 31)})
	if v := q.Outbound(UDP, guest4, netip.MustParseAddrPort("10.0.2.15:9")); !v.Allowed() {
		t.Errorf("/31: %v", v.Reason)
	}
}

func TestInboundSource(t *testing.T) {
	p := New(testConfig(true, false))
	off := New(testConfig(false, false))
	noGW := New(Config{Guest4: netip.PrefixFrom(guest4, 24)})
	cases := []struct {
		pol  *Policy
		peer string
		want string // "" = refused
	}{
		{p, "127.0.0.1", "10.0.2.2"},
		{p, "127.9.9.9", "10.0.2.2"},
		{p, "::ffff:127.0.0.1", "10.0.2.2"},
		{p, "::1", "fe80::1"},
		{p, "10.0.2.15", "10.0.2.2"},     // the host's (and guest's) own address
		{p, "2001:db8:1::15", "fe80::1"}, // the same in IPv6
		{p, "2001:db8:1::99", "2001:db8:1::99"},
		{p, "203.0.113.9", "203.0.113.9"},
		{p, "::ffff:203.0.113.9", "203.0.113.9"},
		{p, "2606:4700::1111", "2606:4700::1111"},
		{p, "0.0.0.0", ""},
		{p, "::", ""},
		{p, "224.0.0.1", ""},
		{p, "255.255.255.255", ""},
		{off, "127.0.0.1", "10.0.2.2"}, // forwards keep working with the mapping off
		{noGW, "127.0.0.1", ""},
		{noGW, "203.0.113.9", "203.0.113.9"},
	}
	for _, c := range cases {
		got, ok := c.pol.InboundSource(netip.MustParseAddr(c.peer))
		if c.want == "" {
			if ok {
				t.Errorf("%s: got %v, want refused", c.peer, got)
			}
			continue
		}
		if !ok || got != netip.MustParseAddr(c.want) {
			t.Errorf("%s: got %v %v, want %s", c.peer, got, ok, c.want)
		}
	}
}

func TestNames(t *testing.T) {
	seen := map[string]bool{}
	for r := Reason(0); r < NumReasons; r++ {
		n := r.String()
		if n == "" || n == "unknown" || seen[n] {
			t.Errorf("reason %d: name %q", r, n)
		}
		seen[n] = true
	}
	if NumReasons.String() != "unknown" || NumProtos.String() != "unknown" {
		t.Error("out-of-range names")
	}
	for p := Proto(0); p < NumProtos; p++ {
		if n := p.String(); n == "unknown" || n == "" {
			t.Errorf("proto %d: %q", p, n)
		}
	}
	if !DstMulticast.Routine() || DstLoopback.Routine() || SrcNotGuest.Routine() {
		t.Error("Routine")
	}
}

func TestOutboundAllocs(t *testing.T) {
	p := New(testConfig(true, true))
	dst := netip.AddrPortFrom(netip.MustParseAddr("::ffff:127.0.0.1"), 80)
	if n := testing.AllocsPerRun(100, func() {
		_ = p.Outbound(TCP, guest6, dst)
		_ = p.Outbound(UDP, guest4, netip.AddrPortFrom(gw4, 53))
	}); n != 0 {
		t.Errorf("%v allocs per run", n)
	}
}

func BenchmarkOutbound(b *testing.B) {
	p := New(testConfig(true, true))
	dsts := []netip.AddrPort{
		netip.AddrPortFrom(remote4, 443), netip.AddrPortFrom(gw4, 53),
		netip.AddrPortFrom(remote6, 443), netip.AddrPortFrom(netip.MustParseAddr("::ffff:127.0.0.1"), 80),
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		d := dsts[i%len(dsts)]
		src := guest4
		if d.Addr().Is6() {
			src = guest6
		}
		_ = p.Outbound(TCP, src, d)
	}
}

func ExamplePolicy_Outbound() {
	p := New(Config{
		Guest4:     netip.MustParsePrefix("10.0.2.15/24"),
		Gateway4:   netip.MustParseAddr("10.0.2.2"),
		MapGateway: true,
	})
	guest := netip.MustParseAddr("10.0.2.15")
	for _, dst := range []string{"10.0.2.2:8080", "127.0.0.1:8080", "192.0.2.7:443"} {
		v := p.Outbound(TCP, guest, netip.MustParseAddrPort(dst))
		if v.Allowed() {
			fmt.Println(dst, "→", v.Host)
		} else {
			fmt.Println(dst, "refused:", v.Reason)
		}
	}
	// Output:
	// 10.0.2.2:8080 → 127.0.0.1:8080
	// 127.0.0.1:8080 refused: dst_loopback
	// 192.0.2.7:443 → 192.0.2.7:443
}

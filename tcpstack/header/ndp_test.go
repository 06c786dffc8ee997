package header

import (
	"net/netip"
	"testing"
)

func parseCapturedICMPv6(t *testing.T, s string) (IPv6, ICMPv6) {
	t.Helper()
	e, err := ParseEthernet(mustHex(t, s))
	if err != nil {
		t.Fatal(err)
	}
	ip, err := ParseIPv6(e.Payload())
	if err != nil {
		t.Fatal(err)
	}
	if ip.NextHeader() != IPProtocolICMPv6 || ip.HopLimit() != NDPHopLimit {
		t.Fatalf("next header %d hop limit %d", ip.NextHeader(), ip.HopLimit())
	}
	m, err := ParseICMPv6(ip.Payload())
	if err != nil {
		t.Fatal(err)
	}
	if !m.IsChecksumValid(ip.Source(), ip.Destination()) {
		t.Fatal("captured ICMPv6 checksum does not verify")
	}
	return ip, m
}

func TestCapturedNeighborSolicit(t *testing.T) {
	ip, m := parseCapturedICMPv6(t, capDADNS)
	if m.Type() != ICMPv6NeighborSolicit || !ip.Source().IsUnspecified() {
		t.Fatalf("type %d src %v", m.Type(), ip.Source())
	}
	target := netip.MustParseAddr("fe80::5054:ff:fe12:3456")
	if ip.Destination() != SolicitedNodeMulticast(target) {
		t.Errorf("dst %v, want solicited-node of target", ip.Destination())
	}
	if IPv6MulticastMAC(ip.Destination().As16()) != (MAC{0x33, 0x33, 0xff, 0x12, 0x34, 0x56}) {
		t.Error("multicast MAC mapping")
	}
	ns, err := ParseNDPNeighborSolicit(m.Body())
	if err != nil || ns.Target() != target {
		t.Fatalf("target %v err %v", ns.Target(), err)
	}
	typ, body, rest, ok, err := NextNDPOption(ns.Options())
	if !ok || err != nil || typ != 14 || len(body) != 6 || len(rest) != 0 {
		t.Errorf("nonce option %d %x", typ, body)
	}
	if _, ok := NDPLinkLayerOption(ns.Options(), NDPOptSourceLinkLayer); ok {
		t.Error("DAD NS has no source link-layer option")
	}
}

func TestCapturedRouterSolicit(t *testing.T) {
	ip, m := parseCapturedICMPv6(t, capRS)
	if m.Type() != ICMPv6RouterSolicit || ip.Destination() != IPv6AllRouters {
		t.Fatalf("type %d dst %v", m.Type(), ip.Destination())
	}
	rs, err := ParseNDPRouterSolicit(m.Body())
	if err != nil {
		t.Fatal(err)
	}
	mac, ok := NDPLinkLayerOption(rs.Options(), NDPOptSourceLinkLayer)
	if !ok || mac != (MAC{0x52, 0x54, 0, 0x12, 0x34, 0x56}) {
		t.Errorf("source link-layer %v %v", mac, ok)
	}
	// Rebuilding the RS reproduces the kernel's bytes and checksum.
	b := make([]byte, 16)
	n := EncodeNDPRouterSolicit(b)
	n += EncodeNDPLinkLayerOption(b[n:], NDPOptSourceLinkLayer, mac)
	ICMPv6(b[:n]).SetChecksum(ip.Source(), ip.Destination())
	if string(b[:n]) != string(m) {
		t.Errorf("rebuilt RS %x, captured %x", b[:n], []byte(m))
	}
}

func TestNDPRouterAdvertBuild(t *testing.T) {
	b := make([]byte, 256)
	n := EncodeNDPRouterAdvert(b, &NDPRouterAdvertFields{CurHopLimit: 64, Flags: NDPRAFlagManaged | NDPRAFlagOther, RouterLifetime: 9000})
	mac := MAC{0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55}
	pfx := netip.MustParsePrefix("2001:db8:1:2::77/64")
	n += EncodeNDPPrefixInfo(b[n:], pfx, NDPPrefixFlagOnLink|NDPPrefixFlagAutonomous, NDPInfiniteLifetime, NDPInfiniteLifetime)
	n += EncodeNDPMTU(b[n:], 65520)
	n += EncodeNDPRDNSS(b[n:], 3600, netip.MustParseAddr("2001:db8::53"), netip.MustParseAddr("1.1.1.1"))
	n += EncodeNDPDNSSL(b[n:], 3600, []string{"example.com", "lab"})
	n += EncodeNDPLinkLayerOption(b[n:], NDPOptSourceLinkLayer, mac)
	src, dst := netip.MustParseAddr("fe80::1"), IPv6AllNodes
	m := ICMPv6(b[:n])
	m.SetChecksum(src, dst)
	if !m.IsChecksumValid(src, dst) || m.Type() != ICMPv6RouterAdvert {
		t.Fatal("RA checksum")
	}
	ra, err := ParseNDPRouterAdvert(m.Body())
	if err != nil || ra.CurHopLimit() != 64 || ra.Flags() != 0xc0 || ra.RouterLifetime() != 9000 || ra.ReachableTime() != 0 || ra.RetransTimer() != 0 {
		t.Fatalf("RA fixed fields %x", []byte(ra))
	}
	if !ValidateNDPOptions(ra.Options()) {
		t.Fatal("options do not validate")
	}
	seen := map[uint8][]byte{}
	for opts := ra.Options(); ; {
		typ, body, rest, ok, err := NextNDPOption(opts)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		seen[typ] = body
		opts = rest
	}
	pi, err := ParseNDPPrefixInfo(seen[NDPOptPrefixInfo])
	if err != nil || pi.Prefix() != netip.MustParsePrefix("2001:db8:1:2::/64") || pi.Flags() != 0xc0 || pi.ValidLifetime() != NDPInfiniteLifetime || pi.PreferredLifetime() != NDPInfiniteLifetime || pi.PrefixLength() != 64 {
		t.Errorf("prefix info %x", seen[NDPOptPrefixInfo])
	}
	if hexString(seen[NDPOptMTU]) != "00000000fff0" {
		t.Errorf("mtu %x", seen[NDPOptMTU])
	}
	if d := seen[NDPOptRDNSS]; len(d) != 22 || netip.AddrFrom16([16]byte(d[6:22])) != netip.MustParseAddr("2001:db8::53") {
		t.Errorf("rdnss %x", d)
	}
	// 8 header + 13 + 5 = 26 -> padded to 32.
	if d := seen[NDPOptDNSSL]; len(d) != 30 || hexString(d[6:24]) != "076578616d706c6503636f6d00036c616200" || hexString(d[24:]) != "000000000000" {
		t.Errorf("dnssl %x", d)
	}
	if mac2, ok := NDPLinkLayerOption(ra.Options(), NDPOptSourceLinkLayer); !ok || mac2 != mac {
		t.Errorf("sll %v", mac2)
	}
	if EncodeNDPRDNSS(b, 1) != 0 || EncodeNDPDNSSL(b, 1, []string{"a..b"}) != 0 {
		t.Error("empty RDNSS/DNSSL written")
	}
}

func TestNDPNeighborAdvertBuild(t *testing.T) {
	b := make([]byte, 32)
	target := netip.MustParseAddr("fe80::1")
	n := EncodeNDPNeighborAdvert(b, NDPNAFlagRouter|NDPNAFlagSolicited|NDPNAFlagOverride, target)
	n += EncodeNDPLinkLayerOption(b[n:], NDPOptTargetLinkLayer, MAC{1, 2, 3, 4, 5, 6})
	if n != 32 {
		t.Fatalf("len %d", n)
	}
	m, _ := ParseICMPv6(b)
	na, err := ParseNDPNeighborAdvert(m.Body())
	if err != nil || na.Flags() != 0xe0 || na.Target() != target || m.Type() != ICMPv6NeighborAdvert {
		t.Fatalf("NA %x", b)
	}
	if mac, ok := NDPLinkLayerOption(na.Options(), NDPOptTargetLinkLayer); !ok || mac != (MAC{1, 2, 3, 4, 5, 6}) {
		t.Error("target link-layer option")
	}
	for _, bad := range [][]byte{{1, 0, 0, 0, 0, 0, 0, 0}, {1, 2, 0, 0, 0, 0, 0, 0}, {1}} {
		if ValidateNDPOptions(bad) {
			t.Errorf("options %x validated", bad)
		}
	}
}

package linksvc

import (
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
)

// svcTestDHCPFrame builds a guest DHCP client frame. extra holds raw
// options (code, length, data...) appended after the message type.
func svcTestDHCPFrame(_ *testing.T, mt header.DHCPv4MessageType, flags uint16, ciaddr string, extra ...[]byte) []byte {
	return guestframe.DHCP(mt, flags, ciaddr, extra...)
}

func opt(code byte, data ...byte) []byte { return guestframe.Opt(code, data...) }

type dhcpWant struct {
	msgType   header.DHCPv4MessageType
	broadcast bool   // Ethernet and IP broadcast destination
	dstIP     string // when not broadcast
	yiaddr    string // "" = 0.0.0.0
	ciaddr    string
	lease     bool
	rapid     bool
	flags     uint16
	search    bool
}

func TestDHCPServiceHandle(t *testing.T) {
	tests := []struct {
		name  string
		frame func(t *testing.T) []byte
		cfg   func(c *AddrConfig)
		want  *dhcpWant // nil = no reply
	}{
		{"captured-udhcpc-discover", func(t *testing.T) []byte { return svcTestHex(t, svcTestCapDHCPDiscover) }, nil,
			&dhcpWant{msgType: header.DHCPOffer, dstIP: "192.168.10.20", yiaddr: "192.168.10.20", lease: true, search: true}},
		{"discover-broadcast-flag", func(t *testing.T) []byte { return svcTestDHCPFrame(t, header.DHCPDiscover, 0x8000, "") }, nil,
			&dhcpWant{msgType: header.DHCPOffer, broadcast: true, yiaddr: "192.168.10.20", lease: true, flags: 0x8000, search: true}},
		{"discover-rapid-commit", func(t *testing.T) []byte {
			return svcTestDHCPFrame(t, header.DHCPDiscover, 0, "", opt(header.DHCPv4OptRapidCommit))
		}, nil, &dhcpWant{msgType: header.DHCPAck, dstIP: "192.168.10.20", yiaddr: "192.168.10.20", lease: true, rapid: true, search: true}},
		{"request-selecting", func(t *testing.T) []byte {
			return svcTestDHCPFrame(t, header.DHCPRequest, 0, "", opt(50, 192, 168, 10, 20), opt(54, 192, 168, 10, 1))
		}, nil, &dhcpWant{msgType: header.DHCPAck, dstIP: "192.168.10.20", yiaddr: "192.168.10.20", lease: true, search: true}},
		{"request-wrong-address", func(t *testing.T) []byte {
			return svcTestDHCPFrame(t, header.DHCPRequest, 0, "", opt(50, 10, 0, 0, 5))
		}, nil, &dhcpWant{msgType: header.DHCPNak, broadcast: true}},
		{"request-other-server", func(t *testing.T) []byte {
			return svcTestDHCPFrame(t, header.DHCPRequest, 0, "", opt(50, 192, 168, 10, 20), opt(54, 192, 168, 10, 2))
		}, nil, nil},
		{"request-renewing", func(t *testing.T) []byte { return svcTestDHCPFrame(t, header.DHCPRequest, 0, "192.168.10.20") }, nil,
			&dhcpWant{msgType: header.DHCPAck, dstIP: "192.168.10.20", yiaddr: "192.168.10.20", ciaddr: "192.168.10.20", lease: true, search: true}},
		{"inform", func(t *testing.T) []byte { return svcTestDHCPFrame(t, header.DHCPInform, 0, "192.168.10.20") }, nil,
			&dhcpWant{msgType: header.DHCPAck, dstIP: "192.168.10.20", ciaddr: "192.168.10.20", search: true}},
		{"release", func(t *testing.T) []byte { return svcTestDHCPFrame(t, header.DHCPRelease, 0, "192.168.10.20") }, nil, nil},
		{"decline", func(t *testing.T) []byte { return svcTestDHCPFrame(t, header.DHCPDecline, 0, "") }, nil, nil},
		{"no-dhcp", func(t *testing.T) []byte { return svcTestDHCPFrame(t, header.DHCPDiscover, 0, "") },
			func(c *AddrConfig) { c.NoDHCP = true }, nil},
		{"ipv4-disabled", func(t *testing.T) []byte { return svcTestDHCPFrame(t, header.DHCPDiscover, 0, "") },
			func(c *AddrConfig) { c.Disable4 = true }, nil},
		{"bad-magic", func(t *testing.T) []byte {
			f := svcTestDHCPFrame(t, header.DHCPDiscover, 0, "")
			f[42+236] = 0
			return f
		}, nil, nil},
		{"server-port-wrong", func(t *testing.T) []byte {
			f := svcTestDHCPFrame(t, header.DHCPDiscover, 0, "")
			f[37] = 68
			return f
		}, nil, nil},
		{"truncated-udp", func(t *testing.T) []byte { return svcTestDHCPFrame(t, header.DHCPDiscover, 0, "")[:200] }, nil, nil},
		{"not-ethernet-ipv4", func(t *testing.T) []byte { return svcTestHex(t, svcTestCapRS) }, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := svcTestConfig()
			if tt.cfg != nil {
				tt.cfg(cfg)
			}
			s := dhcpService{cfg}
			req := tt.frame(t)
			out := make([]byte, 1514)
			n := handle(s.answer, req, out)
			if tt.want == nil {
				if n != 0 {
					t.Fatalf("unexpected reply %x", out[:n])
				}
				return
			}
			if n == 0 {
				t.Fatal("no reply")
			}
			checkDHCPReply(t, cfg, req, out[:n], tt.want)
		})
	}
}

func checkDHCPReply(t *testing.T, cfg *AddrConfig, reqFrame, reply []byte, w *dhcpWant) {
	t.Helper()
	reqIP, _ := header.ParseIPv4(reqFrame[14:])
	reqUDP, _ := header.ParseUDP(reqIP.Payload())
	req, _ := header.ParseDHCPv4(reqUDP.Payload())

	eth, ip, udp := svcTestUDP4Reply(t, reply)
	if eth.Source() != svcTestOurMAC {
		t.Errorf("eth src %v", eth.Source())
	}
	if ip.Source() != netip.MustParseAddr("192.168.10.1") || udp.SourcePort() != 67 || udp.DestinationPort() != 68 {
		t.Errorf("from %v:%d to port %d", ip.Source(), udp.SourcePort(), udp.DestinationPort())
	}
	if w.broadcast {
		if !eth.Destination().IsBroadcast() || ip.Destination() != netip.MustParseAddr("255.255.255.255") {
			t.Errorf("want broadcast, got %v %v", eth.Destination(), ip.Destination())
		}
	} else if eth.Destination() != svcTestGuestMAC || ip.Destination() != netip.MustParseAddr(w.dstIP) {
		t.Errorf("want unicast to %s, got %v %v", w.dstIP, eth.Destination(), ip.Destination())
	}

	m, err := header.ParseDHCPv4(udp.Payload())
	if err != nil {
		t.Fatal(err)
	}
	addrOr0 := func(s string) netip.Addr {
		if s == "" {
			return netip.IPv4Unspecified()
		}
		return netip.MustParseAddr(s)
	}
	if m.Op() != 2 || m.HardwareType() != 1 || m.HardwareLen() != 6 || m.Hops() != 0 || m.TransactionID() != req.TransactionID() ||
		m.Flags() != w.flags || m.ClientIP() != addrOr0(w.ciaddr) || m.YourIP() != addrOr0(w.yiaddr) ||
		m.ServerIP() != netip.IPv4Unspecified() || m.GatewayIP() != netip.IPv4Unspecified() || m.ClientMAC() != svcTestGuestMAC {
		t.Errorf("fixed fields: op %d htype %d hlen %d xid %#x flags %#x ciaddr %v yiaddr %v siaddr %v giaddr %v chaddr %v",
			m.Op(), m.HardwareType(), m.HardwareLen(), m.TransactionID(), m.Flags(), m.ClientIP(), m.YourIP(), m.ServerIP(), m.GatewayIP(), m.ClientMAC())
	}
	if len(m) < 300 || len(m) > 576-28 {
		t.Errorf("message length %d", len(m))
	}

	// Walk every option and compare with what this reply must carry.
	got := map[uint8][]byte{}
	var order []uint8
	for opts := m.Options(); ; {
		code, data, rest, ok, err := header.NextDHCPv4Option(opts)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if len(opts) == 0 || opts[0] != header.DHCPv4OptEnd {
				t.Error("option list does not end with End")
			}
			break
		}
		if code == header.DHCPv4OptDomainSearch && got[code] != nil {
			got[code] = append(got[code], data...)
		} else {
			got[code] = append([]byte(nil), data...)
			order = append(order, code)
		}
		opts = rest
	}
	if order[0] != header.DHCPv4OptMessageType {
		t.Errorf("message type is not the first option: %v", order)
	}
	want := map[uint8]string{
		header.DHCPv4OptMessageType: string([]byte{byte(w.msgType)}),
		header.DHCPv4OptServerID:    "\xc0\xa8\x0a\x01",
	}
	if w.msgType == header.DHCPNak {
		want[header.DHCPv4OptMessage] = "requested address is not the guest's"
	} else {
		want[header.DHCPv4OptSubnetMask] = "\xff\xff\xff\x00"
		want[header.DHCPv4OptRouter] = "\xc0\xa8\x0a\x01"
		want[header.DHCPv4OptDNS] = "\xc0\xa8\x0a\x01\x09\x09\x09\x09"
		want[header.DHCPv4OptInterfaceMTU] = "\xff\xf0"
		if w.search {
			want[header.DHCPv4OptDomainName] = "example.com"
			want[header.DHCPv4OptDomainSearch] = "\x07example\x03com\x00\x03lab\x07example\x03com\x00"
		}
		if w.lease {
			want[header.DHCPv4OptLeaseTime] = "\xff\xff\xff\xff"
		}
		if w.rapid {
			want[header.DHCPv4OptRapidCommit] = ""
		}
	}
	for code, v := range want {
		if g, ok := got[code]; !ok || string(g) != v {
			t.Errorf("option %d = %q (present %v), want %q", code, g, ok, v)
		}
	}
	for code := range got {
		if _, ok := want[code]; !ok {
			t.Errorf("unexpected option %d = %x", code, got[code])
		}
	}
}

func TestDHCPServiceGatewayOutsidePrefix(t *testing.T) {
	cfg := svcTestConfig()
	cfg.IPv4.PrefixLen = 32
	s := dhcpService{cfg}
	out := make([]byte, 1514)
	n := handle(s.answer, svcTestDHCPFrame(t, header.DHCPDiscover, 0, ""), out)
	if n == 0 {
		t.Fatal("no reply")
	}
	_, _, udp := svcTestUDP4Reply(t, out[:n])
	m, _ := header.ParseDHCPv4(udp.Payload())
	if d, _ := m.Option(header.DHCPv4OptSubnetMask); string(d) != "\xff\xff\xff\xff" {
		t.Errorf("mask %x", d)
	}
	// Host route to 192.168.10.1 on-link, then default via it.
	if d, ok := m.Option(header.DHCPv4OptClasslessRoutes); !ok || hexOf(d) != "20c0a80a010000000000c0a80a01" {
		t.Errorf("classless routes %x", d)
	}
	if d, _ := m.Option(header.DHCPv4OptRouter); string(d) != "\xc0\xa8\x0a\x01" {
		t.Errorf("router %x", d)
	}
}

func TestDHCPServiceSmallMaxMessageDropsSearch(t *testing.T) {
	cfg := svcTestConfig()
	for i := 0; i < 30; i++ {
		cfg.Search = append(cfg.Search, strings.Repeat("s", 20)+".example.org")
	}
	s := dhcpService{cfg}
	out := make([]byte, 1514)
	// No option 57: the client accepts 576-byte datagrams only.
	n := handle(s.answer, svcTestDHCPFrame(t, header.DHCPDiscover, 0, ""), out)
	if n == 0 || n > 14+576 {
		t.Fatalf("reply length %d", n)
	}
	_, _, udp := svcTestUDP4Reply(t, out[:n])
	m, _ := header.ParseDHCPv4(udp.Payload())
	if _, ok := m.Option(header.DHCPv4OptDomainSearch); ok {
		t.Error("search list kept although it cannot fit")
	}
	if m.MessageType() != header.DHCPOffer {
		t.Errorf("type %d", m.MessageType())
	}
	// With a 1500-byte limit the list fits, split over several options.
	n = handle(s.answer, svcTestDHCPFrame(t, header.DHCPDiscover, 0, "", opt(57, 0x05, 0xdc)), out)
	_, _, udp = svcTestUDP4Reply(t, out[:n])
	m, _ = header.ParseDHCPv4(udp.Payload())
	if _, ok := m.Option(header.DHCPv4OptDomainSearch); !ok || len(m) > 1500-28 {
		t.Errorf("search list missing with a large limit (len %d)", len(m))
	}
	// An out buffer too short for any reply yields none, not a panic.
	for _, size := range []int{0, 41, 42, 43, 300} {
		if handle(s.answer, svcTestDHCPFrame(t, header.DHCPDiscover, 0, ""), make([]byte, size)) != 0 {
			t.Errorf("reply into %d bytes", size)
		}
	}
}

func TestLinkServicesDoNotAllocate(t *testing.T) {
	cfg := svcTestConfig()
	out := make([]byte, 1514)
	dhcp := dhcpService{cfg}
	dhcp6 := dhcpv6Service{cfg}
	ndp := ndpService{cfg}
	arp := arpService{cfg}
	frames := map[string]func() int{}
	disc := svcTestHex(t, svcTestCapDHCPDiscover)
	frames["dhcp"] = func() int { return handle(dhcp.answer, disc, out) }
	rs := svcTestHex(t, svcTestCapRS)
	frames["ndp-rs"] = func() int { return handle(ndp.answer, rs, out) }
	ns := svcTestNSFrame(t, svcTestGuestLL, "fe80::1", true)
	frames["ndp-ns"] = func() int { return handle(ndp.answer, ns, out) }
	frames["ndp-ra"] = func() int { return ndp.unsolicitedRA(out) }
	sol := svcTestDHCPv6Frame(t, svcTestSolicitRapid)
	frames["dhcpv6"] = func() int { return handle(dhcp6.answer, sol, out) }
	ar := svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.20", "192.168.10.1")
	frames["arp"] = func() int { return handle(arp.answer, ar, out) }
	for name, fn := range frames {
		if fn() == 0 {
			t.Errorf("%s: no reply", name)
		}
		if a := testing.AllocsPerRun(50, func() { fn() }); a != 0 {
			t.Errorf("%s: %v allocs per call", name, a)
		}
	}
}

// Guest frames captured on this project's machines (busybox udhcpc and the
// Linux 6.18 kernel through a TAP device, guest MAC 52:54:00:12:34:56).
const (
	svcTestCapDHCPDiscover = "ffffffffffff52540012345608004500014800000000401179a600000000ffffffff004400430134272a010106003ec62956000000000000000000000000000000000000000052540012345600000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000638253633501013902024037080103060c0f1c2a770c0567756573743c0c756468637020312e33352e303d0701525400123456ff000000000000000000000000"
	svcTestCapRS           = "33330000000252540012345686dd6000000000103afffe80000000000000505400fffe123456ff020000000000000000000000000002850071b5000000000101525400123456"
	svcTestCapDADNS        = "3333ff12345652540012345686dd6000000000203aff00000000000000000000000000000000ff0200000000000000000001ff1234568700b9bc00000000fe80000000000000505400fffe1234560e013929b12611ed"
)

var (
	svcTestGuestMAC = guestframe.GuestMAC
	svcTestOurMAC   = guestframe.OurMAC
	svcTestGuestLL  = guestframe.GuestLL
)

func svcTestConfig() *AddrConfig {
	return &AddrConfig{
		OurMAC: svcTestOurMAC,
		IPv4: IPv4Config{
			Addr: netip.MustParseAddr("192.168.10.20"), PrefixLen: 24, Gateway: netip.MustParseAddr("192.168.10.1"),
		},
		IPv6: IPv6Config{
			Addr: netip.MustParseAddr("2001:db8:10::20"), PrefixLen: 64,
			Gateway: netip.MustParseAddr("fe80::1"), GatewayLL: netip.MustParseAddr("fe80::1"),
		},
		DNS4:   []netip.Addr{netip.MustParseAddr("192.168.10.1"), netip.MustParseAddr("9.9.9.9")},
		DNS6:   []netip.Addr{netip.MustParseAddr("2001:db8::53")},
		Search: []string{"example.com", "lab.example.com"},
		MTU:    65520,
	}
}

func svcTestHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// svcTestUDP4Reply decodes a reply frame as Ethernet/IPv4/UDP and checks
// both checksums.
func svcTestUDP4Reply(t *testing.T, frame []byte) (header.Ethernet, header.IPv4, header.UDP) {
	t.Helper()
	eth, err := header.ParseEthernet(frame)
	if err != nil || eth.Type() != header.EtherTypeIPv4 {
		t.Fatalf("reply ethernet: %v type %v", err, eth.Type())
	}
	ip, err := header.ParseIPv4(eth.Payload())
	if err != nil {
		t.Fatal(err)
	}
	if len(ip) != len(eth.Payload()) {
		t.Errorf("ip total length %d, frame carries %d", len(ip), len(eth.Payload()))
	}
	if !ip.IsChecksumValid() || ip.TTL() != 64 || ip.Protocol() != header.IPProtocolUDP || ip.IsFragment() || ip.HeaderLength() != 20 {
		t.Errorf("ip header %x", []byte(ip[:20]))
	}
	udp, err := header.ParseUDP(ip.Payload())
	if err != nil {
		t.Fatal(err)
	}
	if len(udp) != len(ip.Payload()) || udp.Checksum() == 0 || !udp.IsChecksumValid(ip.Source(), ip.Destination()) {
		t.Errorf("udp length %d/%d checksum %#x invalid", len(udp), len(ip.Payload()), udp.Checksum())
	}
	return eth, ip, udp
}

// svcTestIPv6Reply decodes a reply frame as Ethernet/IPv6 with no extension
// headers.
func svcTestIPv6Reply(t *testing.T, frame []byte, proto header.IPProtocol, hopLimit uint8) (header.Ethernet, header.IPv6) {
	t.Helper()
	eth, err := header.ParseEthernet(frame)
	if err != nil || eth.Type() != header.EtherTypeIPv6 {
		t.Fatalf("reply ethernet: %v type %v", err, eth.Type())
	}
	ip, err := header.ParseIPv6(eth.Payload())
	if err != nil {
		t.Fatal(err)
	}
	if len(ip) != len(eth.Payload()) || ip.NextHeader() != proto || ip.HopLimit() != hopLimit || ip.TrafficClass() != 0 || ip.FlowLabel() != 0 {
		t.Fatalf("ipv6 header %x", []byte(ip[:40]))
	}
	if eth.Source() != svcTestOurMAC {
		t.Errorf("ethernet source %v", eth.Source())
	}
	return eth, ip
}

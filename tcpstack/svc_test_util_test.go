package tcpstack

import (
	"encoding/hex"
	"net/netip"
	"testing"

	"vunet/tcpstack/header"
)

// Guest frames captured on this project's machines (busybox udhcpc and the
// Linux 6.18 kernel through a TAP device, guest MAC 52:54:00:12:34:56).
const (
	svcTestCapDHCPDiscover = "ffffffffffff52540012345608004500014800000000401179a600000000ffffffff004400430134272a010106003ec62956000000000000000000000000000000000000000052540012345600000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000638253633501013902024037080103060c0f1c2a770c0567756573743c0c756468637020312e33352e303d0701525400123456ff000000000000000000000000"
	svcTestCapRS           = "33330000000252540012345686dd6000000000103afffe80000000000000505400fffe123456ff020000000000000000000000000002850071b5000000000101525400123456"
	svcTestCapDADNS        = "3333ff12345652540012345686dd6000000000203aff00000000000000000000000000000000ff0200000000000000000001ff1234568700b9bc00000000fe80000000000000505400fffe1234560e013929b12611ed"
)

var (
	svcTestGuestMAC = header.MAC{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	svcTestOurMAC   = header.MAC{0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55}
	svcTestGuestLL  = netip.MustParseAddr("fe80::5054:ff:fe12:3456")
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

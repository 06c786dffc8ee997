package tcpstack

import (
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// TestLinkServicesThroughLoop sends a DHCP DISCOVER, a Neighbor Solicitation
// for the router and a DHCPv6 SOLICIT through the TX ring and expects the
// services' answers in the RX ring, after the announcements every pair start
// makes (gratuitous ARP, Router Advertisement).
func TestLinkServicesThroughLoop(t *testing.T) {
	p := newTestPair(t, featMrg, 64)
	cfg := Config{Logger: testenv.Logger(), Addr: linkConfig()}
	p.s = New(cfg)
	t.Cleanup(p.s.Close)
	p.postRX(16, 1536)
	p.start()
	p.addTX(guestframe.DHCP(header.DHCPDiscover, 0, ""))
	p.addTX(guestframe.NS(guestframe.GuestLL, cfg.Addr.RouterLL(), true))
	p.addTX(guestframe.DHCPv6(dhcpv6Solicit))
	p.tx.Send()
	st := p.stats()
	waitFor(t, "replies", 3*time.Second, func() bool { return st.RX.Frames.Load() == 5 })
	p.s.StopPair(0)
	_, frames := p.rxRead(t)
	var kinds []string
	for _, f := range frames {
		switch binary.BigEndian.Uint16(f[12:14]) {
		case uint16(header.EtherTypeARP):
			kinds = append(kinds, "arp")
		case uint16(header.EtherTypeIPv4):
			ip := f[header.EthernetMinimumSize:]
			if ip[9] == uint8(header.IPProtocolUDP) && binary.BigEndian.Uint16(ip[20:22]) == 67 {
				kinds = append(kinds, "dhcp")
			}
		case uint16(header.EtherTypeIPv6):
			ip := f[header.EthernetMinimumSize:]
			switch {
			case ip[6] == uint8(header.IPProtocolICMPv6) && ip[40] == 134:
				kinds = append(kinds, "ra")
			case ip[6] == uint8(header.IPProtocolICMPv6) && ip[40] == 136:
				kinds = append(kinds, "na")
			case ip[6] == uint8(header.IPProtocolUDP) && binary.BigEndian.Uint16(ip[40:42]) == 547:
				kinds = append(kinds, "dhcpv6")
			}
		}
	}
	want := []string{"arp", "ra", "dhcp", "na", "dhcpv6"}
	if len(kinds) != len(want) {
		t.Fatalf("frames %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("frames %v, want %v", kinds, want)
		}
	}
	for svc, n := range map[stats.Service]uint64{stats.SvcARP: 1, stats.SvcDHCP: 1, stats.SvcDHCPv6: 1, stats.SvcNDP: 2} {
		if got := st.ServiceReplies[svc].Load(); got != n {
			t.Errorf("%v replies = %d, want %d", svc, got, n)
		}
	}
}

// linkConfig is the link the service tests answer for: the addresses the
// guestframe requests ask for.
func linkConfig() linksvc.AddrConfig {
	return linksvc.AddrConfig{
		OurMAC: guestframe.OurMAC,
		IPv4: linksvc.IPv4Config{Addr: netip.MustParseAddr("192.168.10.20"), PrefixLen: 24,
			Gateway: netip.MustParseAddr("192.168.10.1")},
		IPv6: linksvc.IPv6Config{Addr: netip.MustParseAddr("2001:db8:10::20"), PrefixLen: 64,
			GatewayLL: netip.MustParseAddr("fe80::1")},
	}
}

// DHCPv6 SOLICITs (xid 0x1a2b3c, a DUID-LLT, an empty IA_NA), plain and
// with Rapid Commit.
var (
	dhcpv6Solicit      = mustHex("011a2b3c0001000e000100012b3c4d5e5254001234560006000400170018000800020000" + "0003000c000034560000000000000000")
	dhcpv6SolicitRapid = append(append([]byte(nil), dhcpv6Solicit...), 0, 14, 0, 0)
)

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

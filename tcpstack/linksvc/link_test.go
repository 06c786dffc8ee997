package linksvc

import (
	"testing"

	"vunet/tcpstack/header"
)

// TestReplyKinds: what each answer says it built is what it built, so the
// data path's lease and advertisement counters need no parse of the reply.
func TestReplyKinds(t *testing.T) {
	l := New(svcTestConfig())
	for _, tc := range []struct {
		name   string
		answer func(*header.Packet, []byte, []byte) (int, Reply)
		frame  []byte
		want   Reply
	}{
		{"arp", l.ARP, svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.20", "192.168.10.1"), ReplyOther},
		{"arp announcement", l.ARP, svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.33", "192.168.10.33"), ReplyNone},
		{"dhcp offer", l.DHCP, svcTestDHCPFrame(t, header.DHCPDiscover, 0, ""), ReplyOther},
		{"dhcp rapid ack", l.DHCP, svcTestDHCPFrame(t, header.DHCPDiscover, 0, "", opt(header.DHCPv4OptRapidCommit)), ReplyLease},
		{"dhcp ack", l.DHCP, svcTestDHCPFrame(t, header.DHCPRequest, 0, "", opt(50, 192, 168, 10, 20)), ReplyLease},
		{"dhcp nak", l.DHCP, svcTestDHCPFrame(t, header.DHCPRequest, 0, "", opt(50, 10, 0, 0, 5)), ReplyOther},
		{"dhcp inform ack", l.DHCP, svcTestDHCPFrame(t, header.DHCPInform, 0, "192.168.10.20"), ReplyOther},
		{"dhcpv6 advertise", l.DHCPv6, svcTestDHCPv6Frame(t, d6Solicit), ReplyOther},
		{"dhcpv6 rapid reply", l.DHCPv6, svcTestDHCPv6Frame(t, svcTestSolicitRapid), ReplyLease},
		{"dhcpv6 information reply", l.DHCPv6, svcTestDHCPv6Frame(t, "0b1a2b3c"+d6ClientID), ReplyOther},
		{"ndp router solicit", l.NDP, svcTestHex(t, svcTestCapRS), ReplyRouterAdvert},
		{"ndp neighbor solicit", l.NDP, svcTestNSFrame(t, svcTestGuestLL, "fe80::1", true), ReplyNeighborAdvert},
		{"dhcp to ndp", l.NDP, svcTestDHCPFrame(t, header.DHCPDiscover, 0, ""), ReplyNone},
	} {
		out := make([]byte, 1514)
		n, r := handleReply(tc.answer, tc.frame, out)
		if r != tc.want || (n == 0) != (r == ReplyNone) {
			t.Errorf("%s: %d bytes, reply kind %d, want %d", tc.name, n, r, tc.want)
		}
	}
}

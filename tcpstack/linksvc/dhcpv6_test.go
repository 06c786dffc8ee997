package linksvc

import (
	"net/netip"
	"testing"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
)

// DHCPv6 client messages (xid 0x1a2b3c) assembled from these options.
const (
	d6ClientID          = "0001000e000100012b3c4d5e525400123456"
	d6ORO               = "0006000400170018"
	d6Elapsed           = "000800020000"
	d6IANAEmpty         = "0003000c000034560000000000000000"
	d6Rapid             = "000e0000"
	d6OurServerID       = "0002000a000300019a559a559a55"
	d6OtherServer       = "0002000a00030001020000000001"
	d6IANAOurAddr       = "00030028000034560000000000000000" + "0005001820010db8001000000000000000000020" + "0000000000000000"
	d6IANAElsewhr       = "00030028000034560000000000000000" + "0005001820010db8009900000000000000000020" + "0000000000000000"
	d6Solicit           = "011a2b3c" + d6ClientID + d6ORO + d6Elapsed + d6IANAEmpty
	svcTestSolicitRapid = d6Solicit + d6Rapid
)

// svcTestDHCPv6Frame wraps a DHCPv6 message from the guest's link-local
// address to All_DHCP_Relay_Agents_and_Servers.
func svcTestDHCPv6Frame(t testing.TB, msgHex string) []byte {
	return guestframe.DHCPv6(svcTestHex(t, msgHex))
}

type d6Want struct {
	msgType header.DHCPv6MessageType
	// options in order, each hex of the whole option
	options []string
}

func TestDHCPv6ServiceHandle(t *testing.T) {
	serverID := d6OurServerID
	iaReply := "00030028" + "00003456" + "ffffffff" + "ffffffff" + "00050018" + "20010db8001000000000000000000020" + "ffffffff" + "ffffffff"
	dns := "00170010" + "20010db8000000000000000000000053"
	domains := "0018001e" + "076578616d706c6503636f6d00" + "036c6162076578616d706c6503636f6d00"
	pref := "00070001ff"
	success := "000d00020000"
	tests := []struct {
		name string
		msg  string
		cfg  func(c *AddrConfig)
		want *d6Want
	}{
		{"solicit", d6Solicit, nil, &d6Want{header.DHCPv6Advertise, []string{serverID, d6ClientID, pref, iaReply, dns, domains}}},
		{"solicit-rapid-commit", svcTestSolicitRapid, nil, &d6Want{header.DHCPv6Reply, []string{serverID, d6ClientID, d6Rapid, iaReply, dns, domains}}},
		{"request", "031a2b3c" + d6ClientID + d6OurServerID + d6IANAOurAddr, nil,
			&d6Want{header.DHCPv6Reply, []string{serverID, d6ClientID, iaReply, dns, domains}}},
		{"request-other-server", "031a2b3c" + d6ClientID + d6OtherServer + d6IANAOurAddr, nil, nil},
		{"request-no-client-id", "031a2b3c" + d6OurServerID + d6IANAOurAddr, nil, nil},
		{"renew", "051a2b3c" + d6ClientID + d6OurServerID + d6IANAOurAddr, nil,
			&d6Want{header.DHCPv6Reply, []string{serverID, d6ClientID, iaReply, dns, domains}}},
		{"rebind", "061a2b3c" + d6ClientID + d6IANAOurAddr, nil,
			&d6Want{header.DHCPv6Reply, []string{serverID, d6ClientID, iaReply, dns, domains}}},
		{"confirm-on-link", "041a2b3c" + d6ClientID + d6IANAOurAddr, nil,
			&d6Want{header.DHCPv6Reply, []string{serverID, d6ClientID, success, dns, domains}}},
		{"confirm-not-on-link", "041a2b3c" + d6ClientID + d6IANAElsewhr, nil,
			&d6Want{header.DHCPv6Reply, []string{serverID, d6ClientID, "000d00020004", dns, domains}}},
		{"confirm-nothing", "041a2b3c" + d6ClientID + d6IANAEmpty, nil, nil},
		{"information-request", "0b1a2b3c" + d6ORO, nil, &d6Want{header.DHCPv6Reply, []string{serverID, dns, domains}}},
		{"release", "081a2b3c" + d6ClientID + d6OurServerID + d6IANAOurAddr, nil,
			&d6Want{header.DHCPv6Reply, []string{serverID, d6ClientID, success, dns, domains}}},
		{"solicit-no-global-address", d6Solicit, func(c *AddrConfig) { c.IPv6.Addr = netip.Addr{} },
			&d6Want{header.DHCPv6Advertise, []string{serverID, d6ClientID, pref,
				"00030030" + "00003456" + "00000000" + "00000000" + "000d00200002" + hexOf([]byte("no global address on this link")), dns, domains}}},
		{"solicit-without-ia-na", "011a2b3c" + d6ClientID, func(c *AddrConfig) { c.DNS6 = nil; c.Search = nil },
			&d6Want{header.DHCPv6Advertise, []string{serverID, d6ClientID, pref}}},
		{"advertise-from-guest", "021a2b3c" + d6ClientID, nil, nil},
		{"relay-forward", "0c00" + d6ClientID, nil, nil},
		{"truncated-option", "011a2b3c000100ff0001", nil, nil},
		{"too-short", "01", nil, nil},
		{"no-dhcpv6", d6Solicit, func(c *AddrConfig) { c.NoDHCPv6 = true }, nil},
		{"ipv6-disabled", d6Solicit, func(c *AddrConfig) { c.Disable6 = true }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := svcTestConfig()
			if tt.cfg != nil {
				tt.cfg(cfg)
			}
			s := dhcpv6Service{cfg}
			out := make([]byte, 1514)
			var n int
			if len(tt.msg) < 8 {
				f := svcTestDHCPv6Frame(t, "01000000")
				n = handle(s.answer, f[:len(f)-3], out) // UDP length now past the frame
			} else {
				n = handle(s.answer, svcTestDHCPv6Frame(t, tt.msg), out)
			}
			if tt.want == nil {
				if n != 0 {
					t.Fatalf("unexpected reply %x", out[:n])
				}
				return
			}
			if n == 0 {
				t.Fatal("no reply")
			}
			eth, ip := svcTestIPv6Reply(t, out[:n], header.IPProtocolUDP, 64)
			if eth.Destination() != svcTestGuestMAC || ip.Source() != netip.MustParseAddr("fe80::1") || ip.Destination() != svcTestGuestLL {
				t.Errorf("addressing %v %v -> %v", eth.Destination(), ip.Source(), ip.Destination())
			}
			udp, err := header.ParseUDP(ip.Payload())
			if err != nil || len(udp) != len(ip.Payload()) || udp.SourcePort() != 547 || udp.DestinationPort() != 546 || !udp.IsChecksumValid(ip.Source(), ip.Destination()) {
				t.Fatalf("udp %v ports %d->%d checksum valid %v", err, udp.SourcePort(), udp.DestinationPort(), udp.IsChecksumValid(ip.Source(), ip.Destination()))
			}
			m, _ := header.ParseDHCPv6(udp.Payload())
			if m.MessageType() != tt.want.msgType || m.TransactionID() != 0x1a2b3c {
				t.Errorf("type %d xid %#x", m.MessageType(), m.TransactionID())
			}
			checkOptions(t, m.Options(), func(b []byte) ([]byte, bool, error) {
				_, _, rest, ok, err := header.NextDHCPv6Option(b)
				return rest, ok, err
			}, tt.want.options)
		})
	}
}

func TestDHCPv6ServiceShortOut(t *testing.T) {
	s := dhcpv6Service{svcTestConfig()}
	f := svcTestDHCPv6Frame(t, d6Solicit)
	for _, size := range []int{0, 10, 62, 70, 150} {
		if handle(s.answer, f, make([]byte, size)) != 0 {
			t.Errorf("reply into %d bytes", size)
		}
	}
}

package linksvc

import (
	"bytes"
	"testing"

	"vunet/tcpstack/header"
)

// TestDHCPNames: --hostname and --fqdn reach the guest as DHCP options 12
// and 81 and DHCPv6 option 39, and nothing is sent when they are unset.
func TestDHCPNames(t *testing.T) {
	for _, tc := range []struct {
		name, host, fqdn string
		want12, want81   []byte
		want39           []byte
	}{
		{"unset", "", "", nil, nil, nil},
		{"hostname", "guest1", "", []byte("guest1"), nil, nil},
		{"both", "guest1", "guest1.example.org",
			[]byte("guest1"),
			append([]byte{0x0c, 0xff, 0xff}, "\x06guest1\x07example\x03org\x00"...),
			append([]byte{0x04}, "\x06guest1\x07example\x03org\x00"...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := svcTestConfig()
			cfg.Hostname, cfg.FQDN = tc.host, tc.fqdn
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			out := make([]byte, 2048)
			n := handle(dhcpService{cfg}.answer, svcTestDHCPFrame(t, header.DHCPDiscover, 0, ""), out)
			_, _, udp := svcTestUDP4Reply(t, out[:n])
			m, err := header.ParseDHCPv4(udp.Payload())
			if err != nil {
				t.Fatal(err)
			}
			for code, want := range map[uint8][]byte{12: tc.want12, 81: tc.want81} {
				got, ok := m.Option(code)
				if ok != (want != nil) || !bytes.Equal(got, want) {
					t.Errorf("option %d = %q (%v), want %q", code, got, ok, want)
				}
			}
			n = handle(dhcpv6Service{cfg}.answer, svcTestDHCPv6Frame(t, d6Solicit), out)
			_, ip := svcTestIPv6Reply(t, out[:n], header.IPProtocolUDP, 64)
			m6, err := header.ParseDHCPv6(ip.Payload()[8:])
			if err != nil {
				t.Fatal(err)
			}
			got, ok := m6.Option(39)
			if ok != (tc.want39 != nil) || !bytes.Equal(got, tc.want39) {
				t.Errorf("dhcpv6 option 39 = %q (%v), want %q", got, ok, tc.want39)
			}
		})
	}
	bad := svcTestConfig()
	bad.FQDN = "a..b"
	if bad.Validate() == nil {
		t.Errorf("invalid FQDN accepted")
	}
}

package tcpstack

import (
	"encoding/binary"
	"testing"
	"time"

	"vunet/tcpstack/header"
)

// TestLinkServicesThroughLoop sends a DHCP DISCOVER, a Neighbor Solicitation
// for the router and a DHCPv6 SOLICIT through the TX ring and expects the
// services' answers in the RX ring, after the announcements every pair start
// makes (gratuitous ARP, Router Advertisement).
func TestLinkServicesThroughLoop(t *testing.T) {
	p := newTestPair(t, featMrg, 64)
	cfg := Config{Logger: testLogger(), Addr: *svcTestConfig()}
	p.s = New(cfg)
	t.Cleanup(p.s.Close)
	for i := 0; i < 16; i++ {
		p.rx.AddBuffers(nil, 1536)
	}
	p.rx.Post()
	p.start()
	p.addTX(svcTestDHCPFrame(t, header.DHCPDiscover, 0, ""))
	p.addTX(svcTestNSFrame(t, svcTestGuestLL, cfg.Addr.RouterLL().String(), true))
	p.addTX(svcTestDHCPv6Frame(t, d6Solicit))
	p.tx.Send()
	st := p.stats()
	waitFor(t, "replies", 3*time.Second, func() bool { return st.RX.Frames.Load() == 5 })
	p.s.StopPair(0)
	_, frames := p.rxRead(t)
	var kinds []string
	for _, f := range frames {
		switch binary.BigEndian.Uint16(f[12:14]) {
		case etherTypeARP:
			kinds = append(kinds, "arp")
		case etherTypeIPv4:
			ip := f[ethHdrLen:]
			if ip[9] == ipProtoUDP && binary.BigEndian.Uint16(ip[20:22]) == 67 {
				kinds = append(kinds, "dhcp")
			}
		case etherTypeIPv6:
			ip := f[ethHdrLen:]
			switch {
			case ip[6] == ipProtoICMPv6 && ip[40] == 134:
				kinds = append(kinds, "ra")
			case ip[6] == ipProtoICMPv6 && ip[40] == 136:
				kinds = append(kinds, "na")
			case ip[6] == ipProtoUDP && binary.BigEndian.Uint16(ip[40:42]) == 547:
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
	for svc, n := range map[Service]uint64{SvcARP: 1, SvcDHCP: 1, SvcDHCPv6: 1, SvcNDP: 2} {
		if got := st.ServiceReplies[svc].Load(); got != n {
			t.Errorf("%v replies = %d, want %d", svc, got, n)
		}
	}
}

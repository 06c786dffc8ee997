package tcpstack

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// dgramOpened and dgramClosed count the datagram flows (UDP and ICMP
// echo) a pair opened and closed.
func dgramOpened(st *stats.Queue) uint64 {
	return st.Flows.Opened[stats.FlowUDP].Load() + st.Flows.Opened[stats.FlowICMP].Load()
}

func dgramClosed(st *stats.Queue) uint64 {
	return st.Flows.Closed[stats.FlowUDP].Load() + st.Flows.Closed[stats.FlowICMP].Load()
}

// TestUDPStats: a UDP echo counts one datagram and its payload bytes each
// way and one live flow, which the gauge drops when the flow closes; a
// datagram that cannot be translated is a UDP drop with its reason.
func TestUDPStats(t *testing.T) {
	p := newFlowPair(t, featModern, nil)
	port := udpEcho(t, "udp4", "127.0.0.1:0")
	p.postRX(8, 2048)
	p.start()
	payload := bytes.Repeat([]byte("u"), 123)
	p.addTX(udpFrame(testGuest4, testGw4, 40000, port, payload))
	p.addTX(udpFrame(testGuest4, netip.AddrFrom4([4]byte{224, 0, 0, 251}), 5353, 5353, payload))
	p.tx.Send()
	waitFor(t, "echo", 3*time.Second, func() bool { return p.rxFrames(1) == 1 })
	p.s.StopPair(0)
	ps := &p.stats().Proto
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"udp flows", p.stats().Flows.Live[stats.FlowUDP].Load(), 1},
		{"icmp flows", p.stats().Flows.Live[stats.FlowICMP].Load(), 0},
		{"datagrams to guest", int64(ps.UDPDatagrams[stats.ToGuest].Load()), 1},
		{"datagrams from guest", int64(ps.UDPDatagrams[stats.FromGuest].Load()), 1},
		{"bytes to guest", int64(ps.UDPBytes[stats.ToGuest].Load()), 123},
		{"bytes from guest", int64(ps.UDPBytes[stats.FromGuest].Load()), 123},
		{"multicast drop", int64(ps.UDPDrops[stats.FromGuest][stats.DropPolicy].Load()), 1},
		{"multicast drop in tx drops", int64(p.stats().TX.Drops[stats.DropPolicy].Load()), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	p.s.Close()
	if n := p.stats().Flows.Live[stats.FlowUDP].Load(); n != 0 {
		t.Errorf("udp flows after close = %d", n)
	}
}

// TestServiceStats: leases count only replies that hand out an address
// (ACK, DHCPv6 REPLY with an IA address), not offers or advertises; RAs
// and NAs count as sent.
func TestServiceStats(t *testing.T) {
	p := newTestPair(t, featMrg, 64)
	p.s = New(Config{Logger: testenv.Logger(), Addr: linkConfig()})
	t.Cleanup(p.s.Close)
	p.postRX(16, 1536)
	p.start()
	p.addTX(guestframe.DHCP(header.DHCPDiscover, 0, ""))
	p.addTX(guestframe.DHCP(header.DHCPRequest, 0, "", guestframe.Opt(50, 192, 168, 10, 20)))
	p.addTX(guestframe.DHCPv6(dhcpv6Solicit))      // ADVERTISE: no lease
	p.addTX(guestframe.DHCPv6(dhcpv6SolicitRapid)) // REPLY with IA address
	p.addTX(guestframe.NS(guestframe.GuestLL, p.s.cfg.Addr.RouterLL(), true))
	p.tx.Send()
	st := p.stats()
	// gratuitous ARP, RA, OFFER, ACK, ADVERTISE, REPLY, NA
	waitFor(t, "replies", 3*time.Second, func() bool { return st.RX.Frames.Load() == 7 })
	p.s.StopPair(0)
	ps := &st.Proto
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"dhcp leases", ps.DHCPLeases.Load(), 1},
		{"dhcpv6 leases", ps.DHCPv6Leases.Load(), 1},
		{"router adverts", ps.RouterAdverts.Load(), 1},
		{"neighbor adverts", ps.NeighborAdverts.Load(), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

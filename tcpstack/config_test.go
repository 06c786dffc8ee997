package tcpstack

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/stats"
)

// tcpSYNFrame is a guest SYN to dst:port.
func tcpSYNFrame(src, dst netip.Addr, sport, dport uint16) []byte {
	b := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+header.TCPMinimumSize)
	off := header.EncodeEthernet(b, header.MAC(linksvc.DefaultOurMAC), header.MAC(testGuestMAC), header.EtherTypeIPv4)
	off += header.EncodeIPv4(b[off:], &header.IPv4Fields{TotalLength: uint16(header.IPv4MinimumSize + header.TCPMinimumSize),
		TTL: 64, Protocol: header.IPProtocolTCP, Source: src, Destination: dst})
	header.EncodeTCP(b[off:], &header.TCPFields{SrcPort: sport, DstPort: dport, SeqNum: 1,
		Flags: header.TCPFlagSYN, WindowSize: 65535})
	header.TCP(b[off:]).SetChecksum(src, dst)
	return b
}

// TestProtocolKnobs: NoTCP, NoUDP and NoICMP drop the guest's packets of
// that protocol with a reason, open no host socket, and leave the link
// services (DHCP is UDP) answering.
func TestProtocolKnobs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mod       func(*Config)
		frame     func(port uint16) []byte
		wantDrop  uint64
		wantFlows uint64
		wantTCP   uint64 // host connects attempted
		wantDHCP  uint64
	}{
		{"udp_on", nil, func(p uint16) []byte { return udpFrame(testGuest4, testGw4, 40000, p, []byte("x")) }, 0, 1, 0, 0},
		{"no_udp", func(c *Config) { c.NoUDP = true },
			func(p uint16) []byte { return udpFrame(testGuest4, testGw4, 40000, p, []byte("x")) }, 1, 0, 0, 0},
		{"no_udp_dhcp_served", func(c *Config) { c.NoUDP = true },
			func(uint16) []byte { return guestframe.DHCP(header.DHCPDiscover, 0, "") }, 0, 0, 0, 1},
		{"no_icmp", func(c *Config) { c.NoICMP = true },
			func(uint16) []byte { return icmpEchoFrame(testGuest4, testGw4, 7, 1, []byte("ping")) }, 1, 0, 0, 0},
		{"tcp_on", nil, func(p uint16) []byte { return tcpSYNFrame(testGuest4, testGw4, 40000, p) }, 0, 0, 1, 0},
		{"no_tcp", func(c *Config) { c.NoTCP = true },
			func(p uint16) []byte { return tcpSYNFrame(testGuest4, testGw4, 40000, p) }, 1, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFlowPair(t, featModern, tc.mod)
			port := udpEcho(t, "udp4", "127.0.0.1:0")
			p.postRX(8, 2048)
			p.start()
			p.addTX(tc.frame(port))
			p.tx.Send()
			waitFor(t, "frame consumed", 2*time.Second, func() bool { return p.tx.UsedIdx() == 1 })
			time.Sleep(20 * time.Millisecond)
			p.s.StopPair(0)
			st := p.stats()
			if got := st.TX.Drops[stats.DropProtocolDisabled].Load(); got != tc.wantDrop {
				t.Errorf("protocol_disabled drops %d, want %d", got, tc.wantDrop)
			}
			if got := dgramOpened(st); got != tc.wantFlows {
				t.Errorf("flows opened %d, want %d", got, tc.wantFlows)
			}
			if got := p.s.PairTCPStats(0).Connects.Load(); got != tc.wantTCP {
				t.Errorf("tcp connects %d, want %d", got, tc.wantTCP)
			}
			if got := st.ServiceReplies[stats.SvcDHCP].Load(); got != tc.wantDHCP {
				t.Errorf("dhcp replies %d, want %d", got, tc.wantDHCP)
			}
			if tc.wantDrop > 0 && st.RX.Frames.Load() != uint64(p.announced) {
				t.Errorf("%d frames to the guest, want only the announcement", st.RX.Frames.Load())
			}
		})
	}
}

// TestOutboundSourceUDP: with Outbound4 set, the host socket of a guest
// UDP flow sends from that address.
func TestOutboundSourceUDP(t *testing.T) {
	for _, tc := range []struct {
		name     string
		outbound netip.Addr
		want     netip.Addr
	}{
		{"default", netip.Addr{}, netip.MustParseAddr("127.0.0.1")},
		{"bound", netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			p := newFlowPair(t, featModern, func(cfg *Config) { cfg.Outbound4 = tc.outbound })
			p.start()
			p.addTX(udpFrame(testGuest4, testGw4, 40000, uint16(c.LocalAddr().(*net.UDPAddr).Port), []byte("hello")))
			p.tx.Send()
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 100)
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatal(err)
			}
			if from.Addr() != tc.want || !bytes.Equal(buf[:n], []byte("hello")) {
				t.Errorf("datagram %q from %v, want from %v", buf[:n], from, tc.want)
			}
		})
	}
}

// TestOutboundSourceUnusable: a source address the host does not have
// makes the flow fail (counted), not go out from another address.
func TestOutboundSourceUnusable(t *testing.T) {
	port := udpEcho(t, "udp4", "127.0.0.1:0")
	p := newFlowPair(t, featModern, func(cfg *Config) { cfg.Outbound4 = netip.MustParseAddr("192.0.2.77") })
	p.start()
	p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte("x")))
	p.tx.Send()
	waitFor(t, "frame consumed", 2*time.Second, func() bool { return p.tx.UsedIdx() == 1 })
	p.s.StopPair(0)
	if st := p.stats(); dgramOpened(st) != 0 || st.TX.Drops[stats.DropNoFlow].Load() != 1 {
		t.Errorf("flows %d no_flow drops %d, want 0 and 1", dgramOpened(st), st.TX.Drops[stats.DropNoFlow].Load())
	}
}

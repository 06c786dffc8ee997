package tcpstack

import (
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// TestUDPForward: a datagram from a host peer to a forwarded port reaches
// the guest from the gateway (loopback peer) at the guest port; the
// guest's reply reaches the peer from the forwarded port; the peer's next
// datagram, now taken by the reply flow's socket, arrives the same way.
func TestUDPForward(t *testing.T) {
	for _, tc := range []struct {
		name                string
		v6                  bool
		host                netip.Addr
		network             string
		guest, gw           netip.Addr
		guestPort, wantPort uint16
	}{
		{"v4", false, netip.MustParseAddr("127.0.0.1"), "udp4", testGuest4, testGw4, 5353, 5353},
		{"v6", true, netip.IPv6Loopback(), "udp6", testGuest6, testGw6, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The environment first: an address the host lacks is not the
			// code's failure, Open's own failure is.
			if c, err := net.ListenPacket(tc.network, netip.AddrPortFrom(tc.host, 0).String()); err != nil {
				testenv.Unavailable(t, err, "IPv6 on the loopback interface (sysctl -w net.ipv6.conf.lo.disable_ipv6=0)")
			} else {
				c.Close()
			}
			p := newTestPair(t, featModern, 256)
			cfg := Config{Logger: testenv.Logger()}
			cfg.Addr.IPv4 = linksvc.IPv4Config{Addr: testGuest4, PrefixLen: 24, Gateway: testGw4}
			cfg.Addr.IPv6 = linksvc.IPv6Config{Addr: testGuest6, PrefixLen: 64, GatewayLL: testGw6}
			cfg.Addr.GuestMAC = testGuestMAC
			cfg.UDPForwards = []Forward{{HostAddr: tc.host, GuestPort: tc.guestPort}}
			s, res, err := Open(cfg)
			if err != nil {
				t.Fatalf("open forward: %v", err)
			}
			p.s = s
			t.Cleanup(s.Close)
			port := res.UDPPorts[0]
			if port == 0 || res.Bound != 1 {
				t.Fatalf("result %+v", res)
			}
			guestPort := tc.guestPort
			if guestPort == 0 {
				guestPort = port
			}
			p.postRX(16, 2048)
			p.start()
			c, err := net.DialUDP(tc.network, nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(tc.host, port)))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			peerPort := uint16(c.LocalAddr().(*net.UDPAddr).Port)
			st := p.stats()
			const announced = 2 // gratuitous ARP, router advertisement
			waitFor(t, "announcements", 2*time.Second, func() bool { return st.RX.Frames.Load() == announced })
			if _, err := c.Write([]byte("ping-1")); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "datagram to guest", 2*time.Second, func() bool { return st.RX.Frames.Load() >= announced+1 })
			// The guest replies from its port to the peer as it saw it.
			p.addTX(udpFrame(tc.guest, tc.gw, guestPort, peerPort, []byte("pong")))
			p.tx.Send()
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 100)
			n, err := c.Read(buf) // a connected socket: only from host:port
			if err != nil || string(buf[:n]) != "pong" {
				t.Fatalf("reply %q, %v", buf[:n], err)
			}
			if _, err := c.Write([]byte("ping-2")); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "second datagram", 2*time.Second, func() bool { return st.RX.Frames.Load() >= announced+2 })
			p.s.StopPair(0)
			hdrs, frames := p.rxReadIP(t)
			var got [][]byte
			for i, f := range frames {
				if len(f) > header.EthernetMinimumSize+20 && (f[header.EthernetMinimumSize+9] == uint8(header.IPProtocolUDP) || f[header.EthernetMinimumSize+6] == uint8(header.IPProtocolUDP)) {
					checkUDPFrame(t, hdrs[i], f, tc.gw, tc.guest, peerPort, guestPort, []byte("ping-"+string(rune('1'+len(got)))))
					got = append(got, f)
				}
			}
			if len(got) != 2 {
				t.Fatalf("%d UDP frames to the guest, want 2", len(got))
			}
			if dgramOpened(st) != 1 || st.TX.Drops[stats.DropNoFlow].Load() != 0 || st.TX.Drops[stats.DropSendError].Load() != 0 {
				t.Errorf("flows %d no_flow %d send errors %d", dgramOpened(st),
					st.TX.Drops[stats.DropNoFlow].Load(), st.TX.Drops[stats.DropSendError].Load())
			}
			if st.Proto.UDPDatagrams[stats.ToGuest].Load() != 2 || st.Proto.UDPDatagrams[stats.FromGuest].Load() != 1 || st.Flows.Live[stats.FlowUDP].Load() != 1 {
				t.Errorf("udp datagrams to guest %d from guest %d, flows %d", st.Proto.UDPDatagrams[stats.ToGuest].Load(),
					st.Proto.UDPDatagrams[stats.FromGuest].Load(), st.Flows.Live[stats.FlowUDP].Load())
			}
			s.Close()
			if c2, err := net.ListenUDP(tc.network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(tc.host, port))); err != nil {
				t.Errorf("port still bound after Close: %v", err)
			} else {
				c2.Close()
			}
		})
	}
}

// TestOpenForwardsOptional: a port that cannot be bound fails Open unless
// the forward is Optional; then it is counted and the rest stay open.
func TestOpenForwardsOptional(t *testing.T) {
	taken, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	tport := uint16(taken.LocalAddr().(*net.UDPAddr).Port)
	lo := netip.MustParseAddr("127.0.0.1")
	cfg := Config{Logger: testenv.Logger()}
	cfg.Addr.IPv4 = linksvc.IPv4Config{Addr: testGuest4, PrefixLen: 24, Gateway: testGw4}
	for _, tc := range []struct {
		name     string
		optional bool
		wantErr  bool
	}{{"strict", false, true}, {"optional", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			c := cfg
			c.UDPForwards = []Forward{{HostAddr: lo}, {HostAddr: lo, HostPort: tport, Optional: tc.optional}}
			c.TCPForwards = []Forward{{HostAddr: lo, GuestPort: 22}}
			s, res, err := Open(c)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			defer s.Close()
			if res.Bound != 2 || res.Failed != 1 || len(res.UDPPorts) != 2 || res.UDPPorts[1] != 0 || res.UDPPorts[0] == 0 || res.TCPPorts[0] == 0 {
				t.Errorf("result %+v", res)
			}
			fs := s.ForwardStats()
			if u, tc, f := fs.Ports[stats.FlowUDP].Load(), fs.Ports[stats.FlowTCP].Load(), fs.BindFailures[stats.FlowUDP].Load(); u != 1 || tc != 1 || f != 1 {
				t.Errorf("forward ports udp %d tcp %d, udp bind failures %d; want 1 1 1", u, tc, f)
			}
		})
	}
}

// TestOpenTCPForwards: Open binds every forwarded TCP port (distinct ports
// the kernel picked), they are live at once and close with the Stack; a
// forward whose port is taken fails Open, and that Open leaves nothing
// open, while the Stack holding the port keeps it.
func TestOpenTCPForwards(t *testing.T) {
	cfg := Config{Addr: linksvc.AddrConfig{IPv4: linksvc.IPv4Config{Addr: netip.MustParseAddr("10.0.2.15"), PrefixLen: 24,
		Gateway: netip.MustParseAddr("10.0.2.2")}}}
	cfg.TCPForwards = []Forward{
		{HostAddr: netip.MustParseAddr("127.0.0.1"), GuestPort: 22},
		{HostAddr: netip.MustParseAddr("127.0.0.1"), GuestPort: 80},
	}
	s, res, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ports := res.TCPPorts
	if len(ports) != 2 || ports[0] == 0 || ports[1] == 0 || ports[0] == ports[1] || res.Bound != 2 {
		t.Fatalf("result %+v", res)
	}
	if n := s.pairs[0].tcp.NumListeners(); n != 2 {
		t.Fatalf("%d listeners", n)
	}
	if n := s.ForwardStats().Ports[stats.FlowTCP].Load(); n != 2 {
		t.Fatalf("forward ports gauge %d, want 2", n)
	}
	// The kernel completes the handshake into the backlog: the port is live.
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(ports[0])))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	// A port already taken fails the whole Open, which keeps nothing.
	cfg.TCPForwards = []Forward{
		{HostAddr: netip.MustParseAddr("127.0.0.1"), GuestPort: 443},
		{HostAddr: netip.MustParseAddr("127.0.0.1"), HostPort: ports[0]},
	}
	if s2, res2, err := Open(cfg); err == nil {
		s2.Close()
		t.Fatal("second bind of a forwarded port succeeded")
	} else if len(res2.TCPPorts) != 1 || res2.TCPPorts[0] == 0 {
		t.Fatalf("failed Open result %+v", res2)
	} else if c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(res2.TCPPorts[0]))); err == nil {
		c.Close()
		t.Fatal("a failed Open left a listener open")
	}
	if c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(ports[0]))); err != nil {
		t.Fatalf("the first Stack's forward went with the failed Open: %v", err)
	} else {
		c.Close()
	}

	s.Close()
	if c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(ports[1]))); err == nil {
		c.Close()
		t.Fatal("listener still open after Close")
	}
	if n := s.ForwardStats().Ports[stats.FlowTCP].Load(); n != 0 {
		t.Fatalf("forward ports gauge %d after Close", n)
	}
}

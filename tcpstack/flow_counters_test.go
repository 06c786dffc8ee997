package tcpstack

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// TestFlowCountersByProtocol drives real traffic through a pair: a UDP
// echo, two DNS queries to the gateway (sent to the DNS forward's
// resolver) and a TCP connection count their flows in their protocol; the
// capacities are there before any flow; the resolver receives exactly the
// datagrams counted; closing the Stack brings the live gauges to zero,
// counts the closes, and the TCP connection's reset as a session end.
func TestFlowCountersByProtocol(t *testing.T) {
	resolver := netip.MustParseAddr("127.77.0.1")
	dns, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(resolver, 53)))
	if err != nil {
		testenv.Unavailable(t, fmt.Errorf("a resolver on %v:53: %w", resolver, err), "run the test as root (port 53)")
	}
	defer dns.Close()
	echo := udpEcho(t, "udp4", "127.0.0.1:0")
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()

	p := newFlowPair(t, featModern, func(c *Config) {
		c.MaxFlows = 8
		c.TCP.MaxFlows = 16
		c.Addr.DNSForward4 = resolver
	})
	p.postRX(16, 2048)
	p.start()
	st, ts := p.stats(), p.s.PairTCPStats(0)
	fl := &st.Flows
	for proto, want := range map[stats.FlowProto]int64{stats.FlowTCP: 16, stats.FlowUDP: 8, stats.FlowICMP: 8} {
		if c := fl.Capacity[proto].Load(); c != want {
			t.Errorf("%v capacity %d, want %d", proto, c, want)
		}
	}

	p.addTX(udpFrame(testGuest4, testGw4, 40000, echo, []byte("echo")))
	p.addTX(udpFrame(testGuest4, testGw4, 40001, 53, []byte("query-1")))
	p.addTX(udpFrame(testGuest4, testGw4, 40001, 53, []byte("query-2")))
	p.addTX(tcpSYNFrame(testGuest4, testGw4, 40002, uint16(ln.Addr().(*net.TCPAddr).Port)))
	p.tx.Send()
	dns.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	for i := 1; i <= 2; i++ {
		n, err := dns.Read(buf)
		if err != nil || string(buf[:n]) != fmt.Sprintf("query-%d", i) {
			t.Fatalf("resolver read %q, %v; want query-%d", buf[:n], err, i)
		}
	}
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the guest's connection never reached the host listener")
	}
	waitFor(t, "echo", 3*time.Second, func() bool { return st.Proto.UDPDatagrams[stats.ToGuest].Load() == 1 })
	p.s.StopPair(0)
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"tcp live", fl.Live[stats.FlowTCP].Load(), 1},
		{"tcp opened", int64(fl.Opened[stats.FlowTCP].Load()), 1},
		{"udp live", fl.Live[stats.FlowUDP].Load(), 2},
		{"udp opened", int64(fl.Opened[stats.FlowUDP].Load()), 2},
		{"icmp opened", int64(fl.Opened[stats.FlowICMP].Load()), 0},
		{"dns forward datagrams", int64(st.Proto.DNSForwardDatagrams.Load()), 2},
		{"dns forward connections", int64(ts.DNSForwardConnects.Load()), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	p.s.Close()
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"tcp live", fl.Live[stats.FlowTCP].Load(), 0},
		{"udp live", fl.Live[stats.FlowUDP].Load(), 0},
		{"tcp closed", int64(fl.Closed[stats.FlowTCP].Load()), 1},
		{"udp closed", int64(fl.Closed[stats.FlowUDP].Load()), 2},
		{"tcp session-end resets", int64(ts.Resets[stats.TCPSessionEnd].Load()), 1},
	} {
		if c.got != c.want {
			t.Errorf("after Close: %s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

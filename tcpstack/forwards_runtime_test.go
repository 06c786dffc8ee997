package tcpstack

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
)

var testLoopback = netip.MustParseAddr("127.0.0.1")

// newForwardPair is a running pair whose guest (MAC, addresses) is
// configured, as forwarded connections need, with RX buffers posted.
func newForwardPair(t *testing.T) *testPair {
	t.Helper()
	p := newFlowPair(t, featModern, func(c *Config) { c.Addr.GuestMAC = testGuestMAC })
	p.postRX(32, 2048)
	p.start()
	return p
}

// guestTCPSyns returns the destination ports of the SYNs (without ACK)
// among frames to the guest.
func guestTCPSyns(t *testing.T, frames [][]byte) []uint16 {
	t.Helper()
	var ports []uint16
	for _, f := range frames {
		eth, err := header.ParseEthernet(f)
		if err != nil || eth.Type() != header.EtherTypeIPv4 {
			continue
		}
		ip, err := header.ParseIPv4(eth.Payload())
		if err != nil || ip.Protocol() != header.IPProtocolTCP {
			continue
		}
		th, err := header.ParseTCP(ip.Payload())
		if err == nil && th.Flags() == header.TCPFlagSYN && ip.Destination() == testGuest4 {
			ports = append(ports, th.DestinationPort())
		}
	}
	return ports
}

// TestAddRemoveTCPForwardWhileRunning: a TCP forward added while the
// pair's loop runs takes connections at once (a SYN to the guest's port),
// and once removed the port refuses connections; the connection accepted
// before goes on; the forward gauges follow.
func TestAddRemoveTCPForwardWhileRunning(t *testing.T) {
	p := newForwardPair(t)
	infos, err := p.s.AddForwards(stats.FlowTCP, []Forward{{HostAddr: testLoopback, GuestPort: 8080}})
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].HostPort == 0 || infos[0].GuestPort != 8080 || infos[0].ID == 0 || infos[0].HostAddr != testLoopback {
		t.Fatalf("added %+v", infos)
	}
	port := infos[0].HostPort
	if got := p.s.Forwards(); len(got) != 1 || got[0] != infos[0] {
		t.Fatalf("Forwards() = %+v, want %+v", got, infos)
	}
	fs := p.s.ForwardStats()
	if n := fs.Ports[stats.FlowTCP].Load(); n != 1 {
		t.Fatalf("tcp forward ports %d, want 1", n)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ts := p.s.PairTCPStats(0)
	waitFor(t, "the connection accepted", 3*time.Second, func() bool { return ts.Accepted.Load() == 1 })

	if err := p.s.RemoveForwards([]uint64{infos[0].ID}); err != nil {
		t.Fatal(err)
	}
	if c2, err := net.Dial("tcp4", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		if c2 != nil {
			c2.Close()
		}
		t.Fatalf("dial after removal: %v, want connection refused", err)
	}
	if n := fs.Ports[stats.FlowTCP].Load(); n != 0 || len(p.s.Forwards()) != 0 {
		t.Fatalf("after removal: %d tcp forward ports, list %+v", n, p.s.Forwards())
	}
	if n := p.stats().Flows.Live[stats.FlowTCP].Load(); n != 1 {
		t.Fatalf("%d TCP flows after the removal, want the accepted one", n)
	}
	p.s.StopPair(0)
	_, frames := p.rxReadIP(t)
	if syns := guestTCPSyns(t, frames); len(syns) != 1 || syns[0] != 8080 {
		t.Fatalf("SYNs to the guest's ports %v, want [8080]", syns)
	}
	if err := p.s.RemoveForwards([]uint64{infos[0].ID}); !errors.Is(err, ErrNoForward) {
		t.Fatalf("second removal: %v, want ErrNoForward", err)
	}
}

// TestAddRemoveUDPForwardWhileRunning: a UDP forward added at run time
// delivers a peer's datagram to the guest and carries the guest's reply
// back from the forwarded port; removed, it closes the peer's flow too,
// and the port is closed (the peer's next datagram is refused).
func TestAddRemoveUDPForwardWhileRunning(t *testing.T) {
	p := newForwardPair(t)
	infos, err := p.s.AddForwards(stats.FlowUDP, []Forward{{HostAddr: testLoopback, GuestPort: 5353}})
	if err != nil {
		t.Fatal(err)
	}
	port := infos[0].HostPort
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(testLoopback, port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	peerPort := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	st := p.stats()
	if _, err := c.Write([]byte("query")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the datagram to the guest", 3*time.Second, func() bool { return st.Proto.UDPDatagrams[stats.ToGuest].Load() == 1 })
	p.addTX(udpFrame(testGuest4, testGw4, 5353, peerPort, []byte("answer")))
	p.tx.Send()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 64)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "answer" {
		t.Fatalf("peer got %q, %v", buf[:n], err)
	}
	if n := st.Flows.Live[stats.FlowUDP].Load(); n != 1 {
		t.Fatalf("%d UDP flows, want the peer's", n)
	}
	if err := p.s.RemoveForwards([]uint64{infos[0].ID}); err != nil {
		t.Fatal(err)
	}
	if n := st.Flows.Live[stats.FlowUDP].Load(); n != 0 {
		t.Fatalf("%d UDP flows after the removal, want 0", n)
	}
	// Nothing is bound to the port any more: the kernel answers the next
	// datagram with a port unreachable, which the connected socket reports.
	c.Write([]byte("again"))
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(buf); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("read after removal: %v, want connection refused", err)
	}
	if n := p.s.ForwardStats().Ports[stats.FlowUDP].Load(); n != 0 {
		t.Fatalf("udp forward ports %d after removal", n)
	}
}

// TestAddForwardOverlap: a forward that would share a port with an open
// one of its protocol is refused before anything is bound; the other
// protocol's port of the same number is not an overlap.
func TestAddForwardOverlap(t *testing.T) {
	p := newForwardPair(t)
	infos, err := p.s.AddForwards(stats.FlowTCP, []Forward{{HostAddr: testLoopback}})
	if err != nil {
		t.Fatal(err)
	}
	port := infos[0].HostPort
	for _, fw := range []Forward{
		{HostAddr: testLoopback, HostPort: port},
		{HostPort: port}, // every IPv4 address
		{HostAddr: netip.IPv4Unspecified(), HostPort: port, GuestPort: 22},
	} {
		if _, err := p.s.AddForwards(stats.FlowTCP, []Forward{fw}); !errors.Is(err, ErrForwardOverlap) {
			t.Errorf("%+v: %v, want ErrForwardOverlap", fw, err)
		}
	}
	// Two in one request overlap each other.
	free := freeTCPPort(t)
	if _, err := p.s.AddForwards(stats.FlowTCP, []Forward{{HostAddr: testLoopback, HostPort: free}, {HostPort: free}}); !errors.Is(err, ErrForwardOverlap) {
		t.Errorf("two overlapping in one request: %v", err)
	}
	if got := p.s.Forwards(); len(got) != 1 {
		t.Fatalf("refused requests left forwards: %+v", got)
	}
	if _, err := p.s.AddForwards(stats.FlowUDP, []Forward{{HostAddr: testLoopback, HostPort: port}}); err != nil {
		t.Fatalf("the same UDP port: %v", err)
	}
	if _, err := p.s.AddForwards(stats.FlowICMP, []Forward{{HostAddr: testLoopback}}); err == nil {
		t.Fatal("an ICMP forward was accepted")
	}
}

// TestForwardsOverlapRule: the rule AddForwards applies.
func TestForwardsOverlapRule(t *testing.T) {
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	for _, c := range []struct {
		x, y Forward
		want bool
	}{
		{Forward{HostAddr: a("127.0.0.1"), HostPort: 80}, Forward{HostAddr: a("127.0.0.1"), HostPort: 80}, true},
		{Forward{HostAddr: a("127.0.0.1"), HostPort: 80}, Forward{HostAddr: a("127.0.0.1"), HostPort: 81}, false},
		{Forward{HostAddr: a("127.0.0.1"), HostPort: 80}, Forward{HostAddr: a("127.0.0.2"), HostPort: 80}, false},
		{Forward{HostPort: 80}, Forward{HostAddr: a("192.0.2.1"), HostPort: 80}, true},
		{Forward{HostAddr: a("::"), HostPort: 80}, Forward{HostAddr: a("::1"), HostPort: 80}, true},
		{Forward{HostAddr: a("::"), HostPort: 80}, Forward{HostAddr: a("0.0.0.0"), HostPort: 80}, false},
		{Forward{HostAddr: a("::"), HostPort: 80}, Forward{HostPort: 80}, false},
		{Forward{HostPort: 80, Iface: "eth0"}, Forward{HostPort: 80, Iface: "eth1"}, false},
		{Forward{HostPort: 80, Iface: "eth0"}, Forward{HostPort: 80}, true},
	} {
		if got := forwardsOverlap(c.x, c.y); got != c.want {
			t.Errorf("overlap(%+v, %+v) = %v, want %v", c.x, c.y, got, c.want)
		}
		if got := forwardsOverlap(c.y, c.x); got != c.want {
			t.Errorf("overlap(%+v, %+v) = %v, want %v (symmetric)", c.y, c.x, got, c.want)
		}
	}
}

// freeTCPPort returns a loopback TCP port nothing listens on (now).
func freeTCPPort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// TestForwardChangesAcrossRestarts: forwards added and removed while the
// control plane keeps stopping and starting the pair, and before its
// first start, go through whichever owns the tables at the time: every
// change is applied once (the ports open and close as asked), nothing
// races (-race), and none is lost with a loop that stops.
func TestForwardChangesAcrossRestarts(t *testing.T) {
	p := newFlowPair(t, featModern, func(c *Config) { c.Addr.GuestMAC = testGuestMAC })
	// Before any loop: the caller runs it.
	early, err := p.s.AddForwards(stats.FlowTCP, []Forward{{HostAddr: testLoopback}})
	if err != nil {
		t.Fatal(err)
	}
	p.start()
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 40; i++ {
			proto := stats.FlowTCP
			if i%2 == 1 {
				proto = stats.FlowUDP
			}
			infos, err := p.s.AddForwards(proto, []Forward{{HostAddr: testLoopback}})
			if err == nil {
				err = p.s.RemoveForwards([]uint64{infos[0].ID})
			}
			if err != nil {
				errs <- err
				break
			}
		}
		close(stop)
	}()
	for done := false; !done; {
		select {
		case <-stop:
			done = true
		default:
			p.restart()
		}
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if got := p.s.Forwards(); len(got) != 1 || got[0].ID != early[0].ID {
		t.Fatalf("forwards left: %+v, want the first only", got)
	}
	fs := p.s.ForwardStats()
	if tcp, udp := fs.Ports[stats.FlowTCP].Load(), fs.Ports[stats.FlowUDP].Load(); tcp != 1 || udp != 0 {
		t.Fatalf("forward ports tcp %d udp %d, want 1 0", tcp, udp)
	}
	c, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(early[0].HostPort))))
	if err != nil {
		t.Fatalf("the forward added before the first start: %v", err)
	}
	c.Close()
}

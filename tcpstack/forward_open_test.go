package tcpstack

import (
	"net"
	"net/netip"
	"strconv"
	"testing"

	"vunet/tcpstack/linksvc"
)

// TestOpenTCPForwards: Open binds every forwarded TCP port (distinct ports
// the kernel picked), they are live at once and close with the Stack; a
// forward whose port is taken fails Open, and that Open leaves nothing
// open, while the Stack holding the port keeps it.
func TestOpenTCPForwards(t *testing.T) {
	cfg := Config{Addr: linksvc.AddrConfig{IPv4: linksvc.IPv4Config{Addr: netip.MustParseAddr("10.0.2.15"), PrefixLen: 24,
		Gateway: netip.MustParseAddr("10.0.2.2")}}}
	cfg.TCPForwards = []TCPForward{
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
	// The kernel completes the handshake into the backlog: the port is live.
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(ports[0])))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	// A port already taken fails the whole Open, which keeps nothing.
	cfg.TCPForwards = []TCPForward{
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
}

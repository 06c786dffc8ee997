package tcpstack

import (
	"net"
	"net/netip"
	"strconv"
	"testing"

	"vunet/tcpstack/linksvc"
)

func TestOpenTCPForwards(t *testing.T) {
	s := New(Config{Addr: linksvc.AddrConfig{IPv4: linksvc.IPv4Config{Addr: netip.MustParseAddr("10.0.2.15"), PrefixLen: 24, Gateway: netip.MustParseAddr("10.0.2.2")}}})
	ports, err := s.OpenTCPForwards([]TCPForward{
		{HostAddr: netip.MustParseAddr("127.0.0.1"), GuestPort: 22},
		{HostAddr: netip.MustParseAddr("127.0.0.1"), GuestPort: 80},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 2 || ports[0] == 0 || ports[1] == 0 || ports[0] == ports[1] {
		t.Fatalf("ports %v", ports)
	}
	ps := s.pairs[0]
	if ps == nil || len(ps.tcp.listeners) != 2 || ps.tcp.listeners[0].guestPort != 22 || ps.tcp.listeners[1].guestPort != 80 {
		t.Fatalf("listeners %+v", ps.tcp.listeners)
	}
	if ps.tcp.guestV4 != netip.MustParseAddr("10.0.2.15") || ps.tcp.poll != nil {
		t.Fatalf("guest %v poll %v", ps.tcp.guestV4, ps.tcp.poll)
	}
	// The kernel completes the handshake into the backlog: the port is live.
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(ports[0])))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	// A port already taken fails the whole call and keeps earlier listeners.
	_, err = s.OpenTCPForwards([]TCPForward{
		{HostAddr: netip.MustParseAddr("127.0.0.1"), GuestPort: 443},
		{HostAddr: netip.MustParseAddr("127.0.0.1"), HostPort: ports[0]},
	})
	if err == nil {
		t.Fatal("second bind of a forwarded port succeeded")
	}
	if len(ps.tcp.listeners) != 2 {
		t.Fatalf("failed call left %d listeners, want 2", len(ps.tcp.listeners))
	}

	s.Close()
	if c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(ports[1]))); err == nil {
		c.Close()
		t.Fatal("listener still open after Close")
	}
}

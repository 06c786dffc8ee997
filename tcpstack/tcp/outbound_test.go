package tcp

import (
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
)

// TestOutboundSourceTCP: with a source address set, a guest connection's host
// socket connects from that address.
func TestOutboundSourceTCP(t *testing.T) {
	h := tcpNewHarness(t, Config{Source: hostsock.Source{V4: netip.MustParseAddr("127.0.0.3")}})
	ln := h.listen()
	peer := h.establish(ln, header.TCPOptions{})
	if got := peer.RemoteAddr().(*net.TCPAddr).IP.String(); got != "127.0.0.3" {
		t.Errorf("host connection from %s, want 127.0.0.3", got)
	}
}

// TestForwardBindsInterface: a forward with an interface is bound to it
// (SO_BINDTODEVICE); an unknown interface is an error.
func TestForwardBindsInterface(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	if _, _, err := h.tab.Listen(netip.MustParseAddrPort("127.0.0.1:0"), "lo", 0); err != nil {
		t.Fatal(err)
	}
	fd := h.tab.listeners.All[len(h.tab.listeners.All)-1].fd
	dev, err := unix.GetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE)
	if err != nil || dev != "lo" {
		t.Errorf("SO_BINDTODEVICE %q (%v), want lo", dev, err)
	}
	if _, _, err := h.tab.Listen(netip.MustParseAddrPort("127.0.0.1:0"), "nosuchif0", 0); err == nil {
		t.Errorf("forward on a missing interface opened")
	}
}

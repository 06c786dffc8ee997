package main

import (
	"net"
	"net/netip"
	"testing"

	"vunet/tcpstack/header"
	"vunet/test/guest"
)

// TestPolicyProbes: the probes are well-formed frames to the router's MAC
// with the spelling asked for in the IP header, valid checksums and
// distinct source ports or identifiers, and an answer to any of them is
// recognised as one. The daemon's own parser (tcpstack/header) checks the
// agent's hand-rolled encoding here; the agent itself does not import it.
func TestPolicyProbes(t *testing.T) {
	gwMAC := net.HardwareAddr{0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55}
	p := policyProber{src: testMAC, dst: gwMAC, port: 5999}
	src4, src6 := netip.MustParseAddr("10.0.2.15"), linkLocalOf(testMAC)
	if src6 != netip.MustParseAddr("fe80::5054:ff:fe12:3456") {
		t.Fatalf("link-local %v", src6)
	}
	for _, s := range guest.LoopbackSpellings {
		d := netip.MustParseAddr(s)
		src := src4
		if d.Is6() {
			src = src6
		}
		p.all(src, d)
	}
	if len(p.frames) != 3*len(guest.LoopbackSpellings) {
		t.Fatalf("%d frames", len(p.frames))
	}
	seen := map[uint16]bool{}
	for i, f := range p.frames {
		var pk header.Packet
		if err := header.ParseFrame(f, len(f), &pk); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		want := netip.MustParseAddr(guest.LoopbackSpellings[i/3])
		if eth, _ := header.ParseEthernet(f); eth.Destination() != header.MAC(gwMAC) || pk.Dst != want {
			t.Errorf("frame %d: to %v %v, want %v %v", i, eth.Destination(), pk.Dst, gwMAC, want)
		}
		if pk.EtherType == header.EtherTypeIPv4 {
			if ip, err := header.ParseIPv4(f[14:]); err != nil || !ip.IsChecksumValid() {
				t.Errorf("frame %d: IPv4 header %v, checksum valid %v", i, err, err == nil && ip.IsChecksumValid())
			}
		}
		var id uint16
		var ok bool
		switch pk.Protocol {
		case header.IPProtocolTCP:
			th := header.TCP(pk.L4)
			id, ok = th.SourcePort(), th.IsChecksumValid(pk.Src, pk.Dst) && th.Flags() == header.TCPFlagSYN
		case header.IPProtocolUDP:
			u := header.UDP(pk.L4)
			id, ok = u.SourcePort(), u.IsChecksumValid(pk.Src, pk.Dst) && string(u.Payload()) == guest.PolicyProbePayload
		case header.IPProtocolICMPv4:
			m := header.ICMPv4(pk.L4)
			id, ok = m.Ident(), m.IsChecksumValid()
		case header.IPProtocolICMPv6:
			m := header.ICMPv6(pk.L4)
			id, ok = m.Ident(), m.IsChecksumValid(pk.Src, pk.Dst)
		}
		if !ok || seen[id] {
			t.Errorf("frame %d (%v): id %d valid %v, seen before %v", i, pk.Protocol, id, ok, seen[id])
		}
		seen[id] = true
		// The same frame with addresses and ports swapped is an answer.
		if !p.isAnswer(swapEnds(t, f, &pk)) {
			t.Errorf("frame %d: its mirror is not taken for an answer", i)
		}
		if p.isAnswer(f) {
			t.Errorf("frame %d: the probe itself taken for an answer", i)
		}
	}
}

// swapEnds turns a probe into what an answer would look like: ports
// swapped (TCP, UDP) or an echo reply with the same identifier.
func swapEnds(t *testing.T, f []byte, pk *header.Packet) []byte {
	t.Helper()
	b := append([]byte(nil), f...)
	l4 := b[pk.L4Off:]
	switch pk.Protocol {
	case header.IPProtocolTCP, header.IPProtocolUDP:
		copy(l4[0:2], f[pk.L4Off+2:pk.L4Off+4])
		copy(l4[2:4], f[pk.L4Off:pk.L4Off+2])
	case header.IPProtocolICMPv4:
		l4[0] = 0
	case header.IPProtocolICMPv6:
		l4[0] = 129
	}
	return b
}

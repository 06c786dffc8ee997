package header

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

// eth puts an Ethernet header of type et in front of l3.
func eth(et EtherType, l3 []byte) []byte {
	b := make([]byte, EthernetMinimumSize, EthernetMinimumSize+len(l3))
	EncodeEthernet(b, MAC{0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55}, MAC{0x52, 0x54, 0, 0x12, 0x34, 0x56}, et)
	return append(b, l3...)
}

// withExt inserts IPv6 extension headers (each 8 bytes, type order as
// given, the last pointing at the original next header) after the fixed
// header of the IPv6 packet ip.
func withExt(ip []byte, types ...IPProtocol) []byte {
	out := append([]byte(nil), ip[:IPv6MinimumSize]...)
	next := IPProtocol(ip[6])
	out[6] = byte(types[0])
	for i := range types {
		n := next
		if i+1 < len(types) {
			n = types[i+1]
		}
		out = append(out, byte(n), 0, 0, 0, 0, 0, 0, 0)
	}
	out = append(out, ip[IPv6MinimumSize:]...)
	pl := len(out) - IPv6MinimumSize
	out[4], out[5] = byte(pl>>8), byte(pl)
	return out
}

func TestParseFrame(t *testing.T) {
	v4syn := mustHex(t, capIPv4TCPSYN)
	v6syn := mustHex(t, capIPv6TCPSYN)
	v4udp := mustHex(t, capIPv4UDP)
	v6udp := mustHex(t, capIPv6UDP)
	frag6 := withExt(v6udp, IPProtocolFragment) // Fragment header at 40: offset 0
	frag6[IPv6MinimumSize+3] = 0x01             // M
	frag6[IPv6MinimumSize+7] = 0x2a             // id 42
	v4frag := bytes.Clone(v4udp)
	v4frag[6], v4frag[7] = 0x20, 0x03 // MF, offset 24 bytes
	for _, tc := range []struct {
		name     string
		frame    []byte
		len      int // frame length when more than the bytes given
		proto    IPProtocol
		l4Off    int
		l4Len    int
		tcp      bool
		frag     bool
		fragOff  int
		fragHdr  int
		src, dst string
	}{
		{name: "ipv4 tcp syn", frame: eth(EtherTypeIPv4, v4syn), proto: IPProtocolTCP, l4Off: 34, l4Len: 40, tcp: true,
			src: "10.77.0.1", dst: "10.77.0.2"},
		{name: "ipv6 tcp syn", frame: eth(EtherTypeIPv6, v6syn), proto: IPProtocolTCP, l4Off: 54, l4Len: 40, tcp: true,
			src: "fd77::1", dst: "fd77::2"},
		{name: "ipv6 tcp behind hop-by-hop and destination options", frame: eth(EtherTypeIPv6,
			withExt(v6syn, IPProtocolHopByHop, IPProtocolDestOptions)), proto: IPProtocolTCP, l4Off: 70, l4Len: 40, tcp: true,
			src: "fd77::1", dst: "fd77::2"},
		{name: "ipv4 udp with padding", frame: append(eth(EtherTypeIPv4, v4udp), 0, 0, 0, 0), proto: IPProtocolUDP,
			l4Off: 34, l4Len: 19, src: "10.77.0.1", dst: "10.77.0.2"},
		{name: "ipv6 udp", frame: eth(EtherTypeIPv6, v6udp), proto: IPProtocolUDP, l4Off: 54, l4Len: 16,
			src: "fd77::1", dst: "fd77::2"},
		{name: "ipv4 tcp, copy ends inside the tcp header", frame: eth(EtherTypeIPv4, v4syn)[:50], len: 74,
			proto: IPProtocolTCP, l4Off: 34, l4Len: 40, src: "10.77.0.1", dst: "10.77.0.2"},
		{name: "ipv4 later fragment", frame: eth(EtherTypeIPv4, v4frag), proto: IPProtocolUDP, l4Off: 34, l4Len: 19,
			frag: true, fragOff: 24, src: "10.77.0.1", dst: "10.77.0.2"},
		{name: "ipv6 first fragment", frame: eth(EtherTypeIPv6, frag6), proto: IPProtocolUDP, l4Off: 62, l4Len: 16,
			frag: true, fragHdr: 54, src: "fd77::1", dst: "fd77::2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.frame)
			if tc.len > 0 {
				n = tc.len
			}
			var p Packet
			if err := ParseFrame(tc.frame, n, &p); err != nil {
				t.Fatal(err)
			}
			if p.Protocol != tc.proto || p.L4Off != tc.l4Off || p.L4Len != tc.l4Len {
				t.Errorf("proto %d l4 %d+%d, want %d %d+%d", p.Protocol, p.L4Off, p.L4Len, tc.proto, tc.l4Off, tc.l4Len)
			}
			if want := tc.frame[min(tc.l4Off, len(tc.frame)):min(tc.l4Off+tc.l4Len, len(tc.frame))]; !bytes.Equal(p.L4, want) {
				t.Errorf("L4 %x, want %x", p.L4, want)
			}
			if (p.TCP != nil) != tc.tcp {
				t.Errorf("tcp header %x, want one: %v", p.TCP, tc.tcp)
			}
			if tc.tcp && (p.TCP.SourcePort() == 0 || len(p.TCP) != p.TCP.DataOffset()) {
				t.Errorf("tcp header %x", p.TCP)
			}
			if p.Fragment != tc.frag || p.FragmentOffset != tc.fragOff || p.FragmentHeaderOff != tc.fragHdr {
				t.Errorf("fragment %v off %d hdr %d, want %v %d %d", p.Fragment, p.FragmentOffset, p.FragmentHeaderOff, tc.frag, tc.fragOff, tc.fragHdr)
			}
			if p.Src != netip.MustParseAddr(tc.src) || p.Dst != netip.MustParseAddr(tc.dst) {
				t.Errorf("addresses %v -> %v", p.Src, p.Dst)
			}
			if p.SourceMAC() != (MAC{0x52, 0x54, 0, 0x12, 0x34, 0x56}) {
				t.Errorf("source MAC %v", p.SourceMAC())
			}
		})
	}
}

func TestParseFrameErrors(t *testing.T) {
	v4 := eth(EtherTypeIPv4, mustHex(t, capIPv4UDP))
	v6 := eth(EtherTypeIPv6, mustHex(t, capIPv6UDP))
	mod := func(b []byte, i int, v byte) []byte { b = bytes.Clone(b); b[i] = v; return b }
	// Destination options claiming 32 bytes in a payload of 8 + 16.
	extTooLong := mod(eth(EtherTypeIPv6, withExt(mustHex(t, capIPv6UDP), IPProtocolDestOptions)), 55, 3)
	for _, tc := range []struct {
		name  string
		frame []byte
		len   int
		want  error
	}{
		{"runt", v4[:13], 13, ErrTruncated},
		{"ipv4 short", v4[:30], 30, ErrTruncated},
		{"ipv4 version", mod(v4, 14, 0x65), len(v4), ErrVersion},
		{"ipv4 ihl 4", mod(v4, 14, 0x44), len(v4), ErrBadLength},
		{"ipv4 total below ihl", mod(mod(v4, 16, 0), 17, 10), len(v4), ErrBadLength},
		{"ipv4 total beyond frame", v4, len(v4) - 1, ErrTruncated},
		{"ipv6 version", mod(v6, 14, 0x40), len(v6), ErrVersion},
		{"ipv6 payload beyond frame", v6, len(v6) - 1, ErrTruncated},
		{"ipv6 extension header past the packet", extTooLong, len(extTooLong), ErrTruncated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Packet
			if err := ParseFrame(tc.frame, tc.len, &p); !errors.Is(err, tc.want) {
				t.Errorf("err %v, want %v", err, tc.want)
			}
		})
	}
	// Not IP: no error, nothing past Ethernet.
	var p Packet
	arp := eth(EtherTypeARP, make([]byte, 28))
	if err := ParseFrame(arp, len(arp), &p); err != nil || p.IsIP() || p.L4 != nil {
		t.Errorf("arp: %v %+v", err, p)
	}
}

func TestParseFrameDoesNotAllocate(t *testing.T) {
	frame := eth(EtherTypeIPv6, withExt(mustHex(t, capIPv6TCPSYN), IPProtocolHopByHop))
	var p Packet
	if n := testing.AllocsPerRun(100, func() { _ = ParseFrame(frame, len(frame), &p) }); n != 0 {
		t.Errorf("%v allocs per ParseFrame", n)
	}
}

// FuzzParseFrame: whatever the bytes, every view a Packet holds stays within
// the parsed bytes and every length within the frame.
func FuzzParseFrame(f *testing.F) {
	f.Add(eth(EtherTypeIPv4, mustHex(f, capIPv4TCPSYN)), 0)
	f.Add(eth(EtherTypeIPv6, withExt(mustHex(f, capIPv6TCPSYN), IPProtocolHopByHop, IPProtocolDestOptions)), 0)
	f.Add(eth(EtherTypeIPv6, withExt(mustHex(f, capIPv6UDP), IPProtocolFragment)), 3)
	f.Add(mustHex(f, capMLDv2HopByHop), 0)
	f.Fuzz(func(t *testing.T, frame []byte, extra int) {
		n := len(frame) + min(max(extra, 0), 1<<16)
		var p Packet
		if ParseFrame(frame, n, &p) != nil || !p.IsIP() {
			return
		}
		if p.L4Off < EthernetMinimumSize || p.L4Len < 0 || p.L4Off+p.L4Len > n || p.L3Len+EthernetMinimumSize > n {
			t.Fatalf("l4 %d+%d l3 %d outside frame of %d", p.L4Off, p.L4Len, p.L3Len, n)
		}
		if len(p.L4) > p.L4Len || p.L4Off+len(p.L4) > len(frame) {
			t.Fatalf("L4 view of %d at %d", len(p.L4), p.L4Off)
		}
		if p.TCP != nil && (len(p.TCP) > len(p.L4) || p.TCP.DataOffset() != len(p.TCP)) {
			t.Fatalf("tcp header %d in L4 %d", len(p.TCP), len(p.L4))
		}
		if p.FragmentHeaderOff != 0 && p.FragmentHeaderOff+IPv6FragmentHeaderSize > min(len(frame), EthernetMinimumSize+p.L3Len) {
			t.Fatalf("fragment header at %d", p.FragmentHeaderOff)
		}
		_, _, _ = p.Ports()
	})
}

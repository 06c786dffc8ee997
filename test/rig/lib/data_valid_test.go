package rig

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// csumFold is the Internet checksum's final fold and complement.
func csumFold(s uint32) uint16 {
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// l4Checksum is the reference: the full TCP/UDP checksum over the
// pseudo-header and l4, computed directly (checksum field zero in l4).
func l4Checksum(src, dst []byte, proto byte, l4 []byte) uint16 {
	var s uint32
	s += sum16(src) + sum16(dst) + uint32(proto) + uint32(len(l4))
	b := l4
	if len(b)%2 == 1 {
		b = append(append([]byte(nil), b...), 0)
	}
	s += sum16(b)
	return csumFold(s)
}

// completePartial does what the kernel does with a NEEDS_CSUM frame: sum
// from csum_start to the end (the field holds the pseudo-header sum) and
// store the complement at csum_start+csum_offset.
func completePartial(t *testing.T, buf []byte) {
	t.Helper()
	start := int(binary.LittleEndian.Uint16(buf[testHdrLen-6:]))
	off := int(binary.LittleEndian.Uint16(buf[testHdrLen-4:]))
	f := buf[testHdrLen:]
	b := f[start:]
	if len(b)%2 == 1 {
		b = append(append([]byte(nil), b...), 0)
	}
	binary.BigEndian.PutUint16(f[start+off:], csumFold(sum16(b)))
}

func frameV4(proto byte, payload int) (buf, src, dst []byte, l4 []byte) {
	l4len := payload + 20
	if proto == 17 {
		l4len = payload + 8
	}
	buf = make([]byte, testHdrLen+14+20+l4len)
	buf[0] = hdrFlagDataValid
	f := buf[testHdrLen:]
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0], ip[9] = 0x45, proto
	binary.BigEndian.PutUint16(ip[2:], uint16(20+l4len))
	copy(ip[12:], []byte{10, 213, 0, 1, 10, 213, 0, 2})
	l4 = ip[20:]
	for i := range l4 {
		l4[i] = byte(i*7 + 3)
	}
	if proto == 6 {
		l4[12] = 5 << 4
	}
	binary.BigEndian.PutUint16(l4[map[byte]int{6: 16, 17: 6}[proto]:], 0)
	return buf, ip[12:16], ip[16:20], l4
}

func frameV6(proto byte, payload int) (buf, src, dst []byte, l4 []byte) {
	l4len := payload + 8
	if proto == 6 {
		l4len = payload + 20
	}
	buf = make([]byte, testHdrLen+14+40+l4len)
	buf[0] = hdrFlagDataValid
	f := buf[testHdrLen:]
	binary.BigEndian.PutUint16(f[12:], 0x86dd)
	ip := f[14:]
	ip[0], ip[6] = 0x60, proto
	binary.BigEndian.PutUint16(ip[4:], uint16(l4len))
	for i := 8; i < 40; i++ {
		ip[i] = byte(i * 13)
	}
	l4 = ip[40:]
	for i := range l4 {
		l4[i] = byte(i*5 + 1)
	}
	binary.BigEndian.PutUint16(l4[map[byte]int{6: 16, 17: 6}[proto]:], 0)
	return buf, ip[8:24], ip[24:40], l4
}

func TestTrustDataValidCompletesToTheRightChecksum(t *testing.T) {
	for _, c := range []struct {
		name  string
		make  func(byte, int) ([]byte, []byte, []byte, []byte)
		proto byte
		csum  int
		n     int
	}{
		{"tcp4", frameV4, 6, 16, 1460},
		{"tcp4-odd", frameV4, 6, 16, 1},
		{"udp4", frameV4, 17, 6, 1472},
		{"tcp6", frameV6, 6, 16, 1440},
		{"udp6-odd", frameV6, 17, 6, 333},
	} {
		t.Run(c.name, func(t *testing.T) {
			buf, src, dst, l4 := c.make(c.proto, c.n)
			want := l4Checksum(src, dst, c.proto, l4)
			if !trustDataValid(buf, testHdrLen, len(buf)-testHdrLen) {
				t.Fatal("DATA_VALID frame not converted")
			}
			if buf[0] != hdrFlagNeedsCsum {
				t.Fatalf("flags %#x, want NEEDS_CSUM only", buf[0])
			}
			if off := binary.LittleEndian.Uint16(buf[testHdrLen-4:]); int(off) != c.csum {
				t.Fatalf("csum_offset %d, want %d", off, c.csum)
			}
			completePartial(t, buf)
			if got := binary.BigEndian.Uint16(l4[c.csum:]); got != want {
				t.Fatalf("completed checksum %#04x, want %#04x", got, want)
			}
		})
	}
}

func TestTrustDataValidLeavesOthersAlone(t *testing.T) {
	frag, _, _, _ := frameV4(6, 100)
	binary.BigEndian.PutUint16(frag[testHdrLen+14+6:], 0x2000) // more fragments
	noFlag, _, _, _ := frameV4(6, 100)
	noFlag[0] = 0
	partial, _, _, _ := frameV4(6, 100)
	partial[0] = hdrFlagNeedsCsum | hdrFlagDataValid
	icmp, _, _, _ := frameV4(1, 100)
	short, _, _, _ := frameV4(6, 100)
	arp := make([]byte, testHdrLen+42)
	arp[0] = hdrFlagDataValid
	binary.BigEndian.PutUint16(arp[testHdrLen+12:], 0x0806)
	for name, buf := range map[string][]byte{"fragment": frag, "no DATA_VALID": noFlag,
		"already NEEDS_CSUM": partial, "icmp": icmp, "arp": arp} {
		before := bytes.Clone(buf)
		if trustDataValid(buf, testHdrLen, len(buf)-testHdrLen) || !bytes.Equal(buf, before) {
			t.Errorf("%s: frame changed", name)
		}
	}
	// The IP header claims more than the frame holds: never trusted.
	if trustDataValid(short, testHdrLen, len(short)-testHdrLen-1) {
		t.Error("truncated frame converted")
	}
	// Any prefix of a frame: no panic, no conversion past the bytes given.
	whole, _, _, _ := frameV6(6, 64)
	for n := 0; n < len(whole); n++ {
		b := bytes.Clone(whole[:n])
		trustDataValid(b, testHdrLen, len(whole)-testHdrLen)
	}
}

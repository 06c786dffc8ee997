package header

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// referenceChecksum is RFC 1071's straightforward 16-bit loop, the oracle for
// the 64-bit fast path.
func referenceChecksum(b []byte, initial uint16) uint16 {
	sum := uint32(initial)
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}

func TestChecksumKnownVectors(t *testing.T) {
	tests := []struct {
		name string
		hex  string
		want uint16 // uncomplemented sum
	}{
		// RFC 1071 section 3 worked example.
		{"rfc1071", "0001f203f4f5f6f7", 0xddf2},
		// Classic IPv4 header with checksum field zeroed; stored checksum b861.
		{"ipv4-header", "450000730000400040110000c0a80001c0a800c7", ^uint16(0xb861)},
		{"empty", "", 0},
		{"odd", "ff", 0xff00},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Checksum(mustHex(t, tt.hex), 0); got != tt.want {
				t.Errorf("Checksum = %#04x, want %#04x", got, tt.want)
			}
		})
	}
}

func TestChecksumMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 3000)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for n := 0; n < 200; n++ {
		for _, initial := range []uint16{0, 1, 0xfffe, 0xffff} {
			if got, want := Checksum(buf[:n], initial), referenceChecksum(buf[:n], initial); got != want {
				t.Fatalf("len %d initial %#x: got %#x want %#x", n, initial, got, want)
			}
		}
	}
	for i := 0; i < 500; i++ {
		off, n := r.IntN(64), r.IntN(2900)
		b := buf[off : off+n]
		if got, want := Checksum(b, 0), referenceChecksum(b, 0); got != want {
			t.Fatalf("off %d len %d: got %#x want %#x", off, n, got, want)
		}
	}
	// All-ones data stresses the carry chain.
	ones := make([]byte, 1500)
	for i := range ones {
		ones[i] = 0xff
	}
	if got, want := Checksum(ones, 0xffff), referenceChecksum(ones, 0xffff); got != want {
		t.Fatalf("all ones: got %#x want %#x", got, want)
	}
}

func TestChecksumUpdateMatchesRecompute(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	pkt := make([]byte, 64)
	for i := 0; i < 1000; i++ {
		for j := range pkt {
			pkt[j] = byte(r.Uint32())
		}
		pkt[0], pkt[1] = 0, 0
		binary.BigEndian.PutUint16(pkt[0:2], ^Checksum(pkt, 0))
		w := 2 + 2*r.IntN(30)
		old := binary.BigEndian.Uint16(pkt[w:])
		nv := uint16(r.Uint32())
		if i%10 == 0 {
			nv = 0
		}
		binary.BigEndian.PutUint16(pkt[w:], nv)
		got := ChecksumUpdate(binary.BigEndian.Uint16(pkt[0:2]), old, nv)
		binary.BigEndian.PutUint16(pkt[0:2], got)
		if Checksum(pkt, 0) != 0xffff {
			t.Fatalf("iteration %d: incremental checksum %#x does not verify", i, got)
		}
	}
}

func TestPseudoHeaderChecksumMixedFamiliesNoPanic(t *testing.T) {
	// A misconfigured v4/v6 pair must not panic (builders rely on this):
	// the source's family decides, an address of the other family counts
	// as all zeros.
	v4 := netip.MustParseAddr("10.0.0.1")
	if got, want := PseudoHeaderChecksum(IPProtocolUDP, v4, netip.MustParseAddr("::1"), 8),
		PseudoHeaderChecksum(IPProtocolUDP, v4, netip.IPv4Unspecified(), 8); got != want {
		t.Errorf("v4 source, v6 destination: %#04x, want %#04x (destination as 0.0.0.0)", got, want)
	}
	if got, want := PseudoHeaderChecksum(IPProtocolUDP, netip.Addr{}, netip.Addr{}, 8),
		PseudoHeaderChecksum(IPProtocolUDP, netip.IPv6Unspecified(), netip.IPv6Unspecified(), 8); got != want {
		t.Errorf("zero addresses: %#04x, want %#04x (as ::)", got, want)
	}
}

func BenchmarkChecksum(b *testing.B) {
	for _, n := range []int{20, 64, 1500, 65536} {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(i)
		}
		b.Run(itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(n))
			for b.Loop() {
				_ = Checksum(buf, 0)
			}
		})
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}

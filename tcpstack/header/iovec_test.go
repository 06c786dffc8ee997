package header

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// splitAt cuts b at the given points (ascending, each within b).
func splitAt(b []byte, cuts []int) [][]byte {
	var out [][]byte
	prev := 0
	for _, c := range cuts {
		out = append(out, b[prev:c])
		prev = c
	}
	return append(out, b[prev:])
}

// randomCuts returns k ascending cut points in [0, n], repeats allowed (so
// empty buffers occur), odd positions likely.
func randomCuts(r *rand.Rand, n, k int) []int {
	cuts := make([]int, k)
	for i := range cuts {
		cuts[i] = r.IntN(n + 1)
	}
	for i := 1; i < len(cuts); i++ {
		for j := i; j > 0 && cuts[j] < cuts[j-1]; j-- {
			cuts[j], cuts[j-1] = cuts[j-1], cuts[j]
		}
	}
	return cuts
}

// TestChecksumIovecsMatchesPlain: over any split of the bytes into buffers
// (odd lengths, odd starting offsets, empty buffers, one byte each), and
// for any prefix length n, the iovec sum equals Checksum of the
// concatenated bytes.
func TestChecksumIovecsMatchesPlain(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 3000; iter++ {
		size := r.IntN(300)
		if iter%50 == 0 {
			size = 65535
		}
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(r.UintN(256))
		}
		k := r.IntN(8)
		if iter%7 == 0 && size < 64 {
			k = size // one byte per buffer, and empties
		}
		bufs := splitAt(data, randomCuts(r, size, k))
		n := size
		if iter%3 == 0 {
			n = r.IntN(size + 1)
		}
		initial := uint16(r.UintN(1 << 16))
		want := Checksum(data[:n], initial)
		if got := ChecksumIovecs(bufs, n, initial); got != want {
			t.Fatalf("iter %d: size %d n %d splits %v: got %#04x, want %#04x", iter, size, n, lens(bufs), got, want)
		}
	}
}

// TestChecksumIovecsOddSplits spells out the cases the RFC 1071 byte swap
// exists for: buffers of odd length, so later buffers start at odd
// offsets, with a known sum.
func TestChecksumIovecsOddSplits(t *testing.T) {
	data := []byte{0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7}
	// The header above (RFC 1071 example style) sums to 0xffff with its
	// checksum field in place.
	if Checksum(data, 0) != 0xffff {
		t.Fatalf("fixture: sum %#x", Checksum(data, 0))
	}
	for _, cuts := range [][]int{{1}, {3}, {1, 2}, {1, 4, 7}, {3, 3, 5}, {19}, {0, 20}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}} {
		if got := ChecksumIovecs(splitAt(data, cuts), len(data), 0); got != 0xffff {
			t.Errorf("cuts %v: sum %#04x, want 0xffff", cuts, got)
		}
	}
	// n beyond the buffers sums what is there.
	if got := ChecksumIovecs(splitAt(data, []int{5}), 1000, 0); got != 0xffff {
		t.Errorf("n past the end: %#04x", got)
	}
}

func lens(bufs [][]byte) []int {
	var l []int
	for _, b := range bufs {
		l = append(l, len(b))
	}
	return l
}

// countingBytes is 1, 2, 3 ... n (mod 256): every offset is told apart.
func countingBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i + 1)
	}
	return b
}

func TestCopyAndWriteIovecs(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for iter := 0; iter < 500; iter++ {
		data := countingBytes(r.IntN(100))
		size := len(data)
		bufs := splitAt(bytes.Clone(data), randomCuts(r, size, r.IntN(6)))
		off := r.IntN(size + 2)
		dst := make([]byte, r.IntN(size+2))
		n := CopyFromIovecs(dst, bufs, off)
		want := data[min(off, size):]
		want = want[:min(len(want), len(dst))]
		if n != len(want) || !bytes.Equal(dst[:n], want) {
			t.Fatalf("copy off %d len %d from %v: got %d %v, want %v", off, len(dst), lens(bufs), n, dst[:n], want)
		}
		src := bytes.Repeat([]byte{0xee}, r.IntN(size+2))
		WriteIovecs(bufs, off, src)
		flat := bytes.Join(bufs, nil)
		exp := bytes.Clone(data)
		if off < size {
			copy(exp[off:], src)
		}
		if !bytes.Equal(flat, exp) {
			t.Fatalf("write off %d len %d: got %v, want %v", off, len(src), flat, exp)
		}
	}
}

func BenchmarkChecksumIovecs(b *testing.B) {
	data := make([]byte, 65536)
	bufs := splitAt(data, []int{1501, 3001, 4097, 9000, 30001})
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		ChecksumIovecs(bufs, len(data), 0)
	}
}

// TestSliceIovecs: the pieces cover exactly bytes [off, off+n) of the
// concatenated buffers, in order, with no empty piece, and stop at dst's
// capacity.
func TestSliceIovecs(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for iter := 0; iter < 1000; iter++ {
		data := countingBytes(r.IntN(100))
		size := len(data)
		bufs := splitAt(data, randomCuts(r, size, r.IntN(6)))
		off, n := r.IntN(size+2), r.IntN(size+2)
		room := 1 + r.IntN(8)
		dst, covered := SliceIovecs(make([][]byte, 1, 1+room), bufs, off, n)
		pieces := dst[1:]
		want := data[min(off, size):]
		want = want[:min(len(want), n)]
		got := bytes.Join(pieces, nil)
		if covered != len(got) || !bytes.Equal(got, want[:len(got)]) {
			t.Fatalf("off %d n %d of %v: covered %d, pieces %v; want a prefix of %v", off, n, lens(bufs), covered, pieces, want)
		}
		if covered < len(want) && len(dst) < cap(dst) {
			t.Fatalf("off %d n %d of %v: stopped at %d of %d with room left", off, n, lens(bufs), covered, len(want))
		}
		for _, p := range pieces {
			if len(p) == 0 {
				t.Fatalf("an empty piece in %v", lens(pieces))
			}
		}
		if len(pieces) > 0 && &pieces[0][0] != &data[min(off, size-1)] {
			t.Fatal("the first piece is a copy, not the buffer")
		}
	}
}

package stream

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"
)

var testLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// framed returns frames on the wire: each behind its 32-bit big-endian length.
func framed(frames ...[]byte) []byte {
	var b []byte
	for _, f := range frames {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return b
}

// pattern is n bytes of a pattern that differs per seed.
func pattern(rng *rand.Rand, n int) []byte {
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	return b[:n:n]
}

// socketPair is a connected UNIX stream pair, closed at the end of the test.
func socketPair(t testing.TB) (a, b int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

func TestParse(t *testing.T) {
	frame := bytes.Repeat([]byte{0xab}, 60)
	for _, tc := range []struct {
		name    string
		in      []byte
		wantLen int // bytes consumed, 0: incomplete
		bad     bool
	}{
		{"empty", nil, 0, false},
		{"three length bytes", []byte{0, 0, 0}, 0, false},
		{"length only", []byte{0, 0, 0, 60}, 0, false},
		{"one byte short", framed(frame)[:63], 0, false},
		{"whole", framed(frame), 64, false},
		{"whole and more", append(framed(frame), 1, 2, 3), 64, false},
		{"smallest", framed(make([]byte, MinFrame)), LenSize + MinFrame, false},
		{"largest", framed(make([]byte, MaxFrame)), LenSize + MaxFrame, false},
		{"zero length", []byte{0, 0, 0, 0}, 0, true},
		{"below an Ethernet header", framed(make([]byte, MinFrame-1)), 0, true},
		{"above the largest", []byte{0, 1, 0, 0}, 0, true},
		{"huge", []byte{0xff, 0xff, 0xff, 0xff}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, n, err := Parse(tc.in)
			if tc.bad != errors.Is(err, ErrFrameLength) || (err != nil && !tc.bad) {
				t.Fatalf("err %v, want bad=%v", err, tc.bad)
			}
			if n != tc.wantLen {
				t.Fatalf("consumed %d, want %d", n, tc.wantLen)
			}
			if n > 0 && !bytes.Equal(f, tc.in[LenSize:n]) {
				t.Fatal("frame is not the bytes behind the length")
			}
		})
	}
}

// TestReaderSplitAnywhere writes frames of every size class through a
// socket in pieces split at random byte offsets (the length prefix too)
// and checks that Read and Next return exactly the frames, in order.
func TestReaderSplitAnywhere(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		a, b := socketPair(t)
		var want [][]byte
		for i := 0; i < 60; i++ {
			n := MinFrame + rng.IntN(1600)
			if rng.IntN(8) == 0 {
				n = MaxFrame - rng.IntN(3)
			}
			want = append(want, pattern(rng, n))
		}
		wire := framed(want...)
		var r Reader
		r.Init(0) // the smallest buffer: a partial frame is moved to the front often
		var got [][]byte
		for len(wire) > 0 || len(got) < len(want) {
			if len(wire) > 0 {
				k := min(len(wire), 1+rng.IntN(5000))
				if rng.IntN(10) == 0 {
					k = 1 // a lone byte, inside a length prefix now and then
				}
				if _, err := unix.Write(b, wire[:k]); err != nil {
					t.Fatal(err)
				}
				wire = wire[k:]
			}
			if _, err := r.Read(a); err != nil {
				t.Fatalf("seed %d: read: %v", seed, err)
			}
			for {
				f, err := r.Next()
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				if f == nil {
					break
				}
				got = append(got, bytes.Clone(f))
			}
		}
		if len(got) != len(want) {
			t.Fatalf("seed %d: %d frames, want %d", seed, len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("seed %d: frame %d differs (%d bytes, want %d)", seed, i, len(got[i]), len(want[i]))
			}
		}
		if r.Buffered() != 0 {
			t.Fatalf("seed %d: %d bytes left over", seed, r.Buffered())
		}
	}
}

// TestReaderEndOfStream: EAGAIN on an empty socket, io.EOF once the peer
// closed, with what was buffered of a frame still reported.
func TestReaderEndOfStream(t *testing.T) {
	a, b := socketPair(t)
	var r Reader
	r.Init(ReadBufSize)
	if _, err := r.Read(a); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("empty socket: %v, want EAGAIN", err)
	}
	w := framed(make([]byte, 100))
	unix.Write(b, w[:50])
	unix.Shutdown(b, unix.SHUT_WR)
	if n, err := r.Read(a); n != 50 || err != nil || r.Full() {
		t.Fatalf("read %d, %v, full %v", n, err, r.Full())
	}
	if f, err := r.Next(); f != nil || err != nil {
		t.Fatalf("a partial frame came out: %d bytes, %v", len(f), err)
	}
	if _, err := r.Read(a); err != io.EOF {
		t.Fatalf("after close: %v, want io.EOF", err)
	}
	if r.Buffered() != 50 {
		t.Fatalf("buffered %d, want 50", r.Buffered())
	}
}

// TestReaderHostileLength: a length out of bounds after good frames is
// reported once the good ones are out, and nothing after it is handed out.
func TestReaderHostileLength(t *testing.T) {
	for _, l := range []uint32{0, MinFrame - 1, MaxFrame + 1, 1 << 31, 0xffffffff} {
		a, b := socketPair(t)
		good := make([]byte, 64)
		wire := framed(good, good)
		wire = binary.BigEndian.AppendUint32(wire, l)
		wire = append(wire, framed(good)...)
		unix.Write(b, wire)
		var r Reader
		r.Init(ReadBufSize)
		if _, err := r.Read(a); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if f, err := r.Next(); len(f) != 64 || err != nil {
				t.Fatalf("length %d: good frame %d: %d bytes, %v", l, i, len(f), err)
			}
		}
		for i := 0; i < 2; i++ { // and it stays reported
			if f, err := r.Next(); f != nil || !errors.Is(err, ErrFrameLength) {
				t.Fatalf("length %d: %d bytes, %v; want ErrFrameLength", l, len(f), err)
			}
		}
	}
}

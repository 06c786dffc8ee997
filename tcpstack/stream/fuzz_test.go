package stream

import (
	"bytes"
	"errors"
	"testing"
)

// fuzzReader is the one Reader of the fuzz target (its buffer is
// allocated once).
var fuzzReader Reader

// FuzzStreamFraming feeds bytes from the peer to a Reader in chunks of
// fuzzer-chosen sizes and checks it against Parse run over the whole
// input at once: the same frames in the same order, the hostile length
// found at the same place, no panic whatever the lengths say, and never
// more buffered than the largest frame and its length.
func FuzzStreamFraming(f *testing.F) {
	f.Add(framed(make([]byte, 60), make([]byte, MinFrame)), []byte{3, 1, 200})
	f.Add(framed(make([]byte, MaxFrame)), []byte{0, 255, 7})
	f.Add([]byte{0, 0, 0, 13, 1, 2, 3}, []byte{1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, []byte{2, 2})
	f.Add(append(framed(make([]byte, 100)), 0, 1, 0, 0), []byte{50, 50, 4})
	f.Fuzz(fuzzOne)
}

func fuzzOne(t *testing.T, data, splits []byte) {
	// The reference: Parse over everything.
	var want [][]byte
	wantBad := false
	for rest := data; ; {
		fr, n, err := Parse(rest)
		if err != nil {
			wantBad = true
			break
		}
		if n == 0 {
			break
		}
		want = append(want, fr)
		rest = rest[n:]
	}
	r := &fuzzReader
	if r.buf == nil {
		r.Init(0)
	}
	r.Reset()
	var got [][]byte
	bad := false
	rest := data
	for i := 0; len(rest) > 0 && !bad; i++ {
		k := len(rest)
		if len(splits) > 0 {
			k = 1 + int(splits[i%len(splits)])*37
		}
		room := r.room()
		k = min(k, len(rest), len(room))
		copy(room, rest[:k])
		r.added(k)
		rest = rest[k:]
		for {
			fr, err := r.Next()
			if err != nil {
				if !errors.Is(err, ErrFrameLength) {
					t.Fatalf("error %v", err)
				}
				bad = true
				break
			}
			if fr == nil {
				break
			}
			if len(fr) < MinFrame || len(fr) > MaxFrame {
				t.Fatalf("a frame of %d bytes came out", len(fr))
			}
			got = append(got, bytes.Clone(fr))
		}
		if r.Buffered() > LenSize+MaxFrame && !bad {
			t.Fatalf("%d bytes buffered without a frame", r.Buffered())
		}
	}
	if bad != wantBad || len(got) != len(want) {
		t.Fatalf("%d frames (bad length %v), Parse found %d (bad length %v)", len(got), bad, len(want), wantBad)
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d differs", i)
		}
	}
}

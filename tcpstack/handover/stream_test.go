package handover

import (
	"bytes"
	"errors"
	"testing"
)

func TestStreamRoundTrip(t *testing.T) {
	items := []Item{{Kind: KindTCP, Pair: 1, Data: bytes.Repeat([]byte{7}, 5000), FD: -1}, {Kind: KindDgram, Data: nil, FD: 3}}
	var b bytes.Buffer
	if err := WriteStream(&b, items); err != nil {
		t.Fatal(err)
	}
	got, err := ReadStream(&b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Pair != 1 || !bytes.Equal(got[0].Data, items[0].Data) || got[1].Kind != KindDgram || got[1].FD != -1 || len(got[1].Data) != 0 {
		t.Fatalf("got %+v", got)
	}
}

func TestStreamHostile(t *testing.T) {
	var good bytes.Buffer
	WriteStream(&good, []Item{{Kind: KindTCP, Data: []byte("x")}})
	g := good.Bytes()
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"short header", g[:5]},
		{"truncated item", g[:len(g)-1]},
		{"trailing byte", append(append([]byte(nil), g...), 0)},
		{"bad magic", append([]byte{1}, g[1:]...)},
		{"huge count", append(append(append([]byte(nil), g[:8]...), 0xff, 0xff, 0xff, 0xff), g[12:]...)},
		{"huge item", append(append(append([]byte(nil), g[:16]...), 0xff, 0xff, 0xff, 0x7f), g[20:]...)},
		{"unknown kind", append(append(append([]byte(nil), g[:12]...), 9), g[13:]...)},
	} {
		if _, err := ReadStream(bytes.NewReader(tc.b)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func FuzzReadStream(f *testing.F) {
	var b bytes.Buffer
	WriteStream(&b, []Item{{Kind: KindTCP, Pair: 2, Data: []byte("state")}, {Kind: KindDgram, Data: []byte{1, 2}}})
	f.Add(b.Bytes())
	f.Fuzz(func(t *testing.T, in []byte) {
		items, err := ReadStream(bytes.NewReader(in))
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := WriteStream(&out, items); err != nil || !bytes.Equal(out.Bytes(), in) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}

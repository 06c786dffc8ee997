package virtqueue_test

import (
	"bytes"
	"errors"
	"testing"

	"vunet/virtqueue"
)

func TestNetHdrLenFor(t *testing.T) {
	for _, tc := range []struct {
		features uint64
		want     int
	}{
		{0, 10},
		{1 << virtqueue.FeatureNetCsum, 10},
		{1 << virtqueue.FeatureNetMrgRxbuf, 12},
		{1 << virtqueue.FeatureVersion1, 12},
		{1<<virtqueue.FeatureVersion1 | 1<<virtqueue.FeatureNetMrgRxbuf, 12},
		{^uint64(0), 12},
	} {
		if got := virtqueue.NetHdrLenFor(tc.features); got != tc.want {
			t.Errorf("NetHdrLenFor(%#x) = %d, want %d", tc.features, got, tc.want)
		}
	}
}

func TestNetHdrCodec(t *testing.T) {
	h := virtqueue.NetHdr{
		Flags: virtqueue.NetHdrFNeedsCsum, GSOType: virtqueue.GSOTCPv4 | virtqueue.GSOECN,
		HdrLen: 0x0102, GSOSize: 1448, CsumStart: 34, CsumOffset: 16, NumBuffers: 3,
	}
	wire12 := []byte{0x01, 0x81, 0x02, 0x01, 0xa8, 0x05, 0x22, 0x00, 0x10, 0x00, 0x03, 0x00}
	for _, tc := range []struct {
		name string
		buf  int
		n    int
		want []byte
	}{
		{"12 bytes", 12, 12, wire12},
		{"longer buffer writes 12", 20, 12, wire12},
		{"legacy 10", 10, 10, wire12[:10]},
		{"11 writes 10", 11, 10, wire12[:10]},
		{"short", 9, 0, nil},
		{"empty", 0, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bytes.Repeat([]byte{0xcc}, tc.buf)
			n := h.Encode(b)
			if n != tc.n {
				t.Fatalf("Encode = %d, want %d", n, tc.n)
			}
			if !bytes.Equal(b[:n], tc.want) {
				t.Fatalf("wire %x, want %x", b[:n], tc.want)
			}
			for _, x := range b[n:] {
				if x != 0xcc {
					t.Fatalf("Encode wrote past %d bytes: %x", n, b)
				}
			}
		})
	}
	var got virtqueue.NetHdr
	if err := got.Decode(wire12); err != nil || got != h {
		t.Fatalf("Decode(12) = %+v, %v", got, err)
	}
	if !got.NeedsCsum() || got.GSOKind() != virtqueue.GSOTCPv4 {
		t.Errorf("NeedsCsum %v GSOKind %d", got.NeedsCsum(), got.GSOKind())
	}
	got.NumBuffers = 9
	want10 := h
	want10.NumBuffers = 0
	if err := got.Decode(wire12[:10]); err != nil || got != want10 {
		t.Fatalf("Decode(10) = %+v, %v", got, err)
	}
	if err := got.Decode(wire12[:9]); !errors.Is(err, virtqueue.ErrShortNetHdr) {
		t.Fatalf("Decode(9) = %v", err)
	}
}

func TestHasFeature(t *testing.T) {
	f := uint64(1)<<virtqueue.FeatureVersion1 | 1<<virtqueue.FeatureRingEventIdx
	if !virtqueue.HasFeature(f, virtqueue.FeatureVersion1) || !virtqueue.HasFeature(f, virtqueue.FeatureRingEventIdx) ||
		virtqueue.HasFeature(f, virtqueue.FeatureRingIndirectDesc) || virtqueue.HasFeature(^uint64(0), 64) {
		t.Fatal("HasFeature")
	}
}

func FuzzNetHdr(f *testing.F) {
	f.Add([]byte{0x01, 0x81, 0x02, 0x01, 0xa8, 0x05, 0x22, 0x00, 0x10, 0x00, 0x03, 0x00})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{2, 4, 0x36, 0, 0xa0, 0x05, 0x36, 0, 0x10, 0, 1, 0, 0xde, 0xad})
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h virtqueue.NetHdr
		err := h.Decode(b)
		if len(b) < virtqueue.NetHdrLenLegacy {
			if err == nil {
				t.Fatal("short header decoded")
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		out := make([]byte, len(b))
		n := h.Encode(out)
		want := virtqueue.NetHdrLen
		if len(b) < virtqueue.NetHdrLen {
			want = virtqueue.NetHdrLenLegacy
		}
		if n != want || !bytes.Equal(out[:n], b[:n]) {
			t.Fatalf("round trip: %x -> %+v -> %x", b, h, out[:n])
		}
	})
}

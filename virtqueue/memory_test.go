package virtqueue_test

import (
	"bytes"
	"errors"
	"math"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
)

func mustRegion(t *testing.T, s virtqueue.RegionSpec) *virtqueue.Region {
	t.Helper()
	r, err := virtqueue.NewRegion(s, make([]byte, s.Size))
	if err != nil {
		t.Fatal(err)
	}
	for i, b := 0, r.Bytes(); i < len(b); i++ {
		b[i] = byte(i)
	}
	return r
}

// Two adjacent regions [0x1000,0x2000) and [0x2000,0x3000), a hole, and
// [0x10000,0x11000); user addresses elsewhere and in another order.
func testMemory(t *testing.T) (*virtqueue.Memory, []*virtqueue.Region) {
	t.Helper()
	rs := []*virtqueue.Region{
		mustRegion(t, virtqueue.RegionSpec{GuestAddr: 0x10000, Size: 0x1000, UserAddr: 0x7000_0000}),
		mustRegion(t, virtqueue.RegionSpec{GuestAddr: 0x1000, Size: 0x1000, UserAddr: 0x9000_0000}),
		mustRegion(t, virtqueue.RegionSpec{GuestAddr: 0x2000, Size: 0x1000, UserAddr: 0x8000_0000}),
	}
	m, err := virtqueue.NewMemory(rs)
	if err != nil {
		t.Fatal(err)
	}
	return m, rs
}

func TestNewMemoryRejects(t *testing.T) {
	for _, tc := range []struct {
		name  string
		specs []virtqueue.RegionSpec
	}{
		{"guest overlap", []virtqueue.RegionSpec{{GuestAddr: 0, Size: 0x2000, UserAddr: 0x10000}, {GuestAddr: 0x1fff, Size: 0x1000, UserAddr: 0x20000}}},
		{"user overlap", []virtqueue.RegionSpec{{GuestAddr: 0, Size: 0x1000, UserAddr: 0x10000}, {GuestAddr: 0x1000, Size: 0x1000, UserAddr: 0x10fff}}},
		{"same region twice", []virtqueue.RegionSpec{{GuestAddr: 0, Size: 0x1000}, {GuestAddr: 0, Size: 0x1000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rs []*virtqueue.Region
			for _, s := range tc.specs {
				rs = append(rs, mustRegion(t, s))
			}
			if _, err := virtqueue.NewMemory(rs); err == nil {
				t.Fatal("overlapping table accepted")
			}
		})
	}
	if _, err := virtqueue.NewMemory([]*virtqueue.Region{nil}); err == nil {
		t.Fatal("nil region accepted")
	}
	m, err := virtqueue.NewMemory(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.GuestSlice(0, 1); err == nil {
		t.Fatal("empty memory translated an address")
	}
}

func TestRegionSpecRejects(t *testing.T) {
	for _, s := range []virtqueue.RegionSpec{
		{Size: 0},
		{GuestAddr: math.MaxUint64 - 10, Size: 0x1000},
		{UserAddr: math.MaxUint64 - 0xfff, Size: 0x1000},
		{MmapOffset: math.MaxInt64, Size: 1},
	} {
		if _, err := virtqueue.NewRegion(s, make([]byte, s.Size)); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
	if _, err := virtqueue.NewRegion(virtqueue.RegionSpec{Size: 10}, make([]byte, 9)); err == nil {
		t.Error("length mismatch accepted")
	}
}

func TestGuestSlice(t *testing.T) {
	m, _ := testMemory(t)
	for _, tc := range []struct {
		name  string
		gpa   uint64
		n     uint64
		ok    bool
		first byte
	}{
		{"start", 0x1000, 16, true, 0},
		{"inside", 0x1010, 16, true, 0x10},
		{"to the last byte", 0x1ff0, 0x10, true, 0xf0},
		{"one past the end", 0x1ff0, 0x11, false, 0},
		{"across adjacent regions", 0x1fff, 2, false, 0},
		{"whole region", 0x2000, 0x1000, true, 0},
		{"zero length inside", 0x2000, 0, true, 0},
		{"zero length in hole", 0x5000, 0, false, 0},
		{"below memory", 0xfff, 1, false, 0},
		{"hole", 0x3000, 1, false, 0},
		{"after memory", 0x11000, 1, false, 0},
		{"huge length wraps", 0x1000, math.MaxUint64, false, 0},
		{"length wraps to small", 0x1010, math.MaxUint64 - 0xf, false, 0},
		{"top of address space", math.MaxUint64, 1, false, 0},
		{"len 0xffffffff", 0x1000, 0xffffffff, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := m.GuestSlice(tc.gpa, tc.n)
			if (err == nil) != tc.ok {
				t.Fatalf("GuestSlice(%#x, %#x) err = %v, want ok=%v", tc.gpa, tc.n, err, tc.ok)
			}
			if !tc.ok {
				if !errors.Is(err, virtqueue.ErrOutOfMemory) {
					t.Errorf("error %v does not wrap ErrOutOfMemory", err)
				}
				return
			}
			if uint64(len(b)) != tc.n || uint64(cap(b)) != tc.n {
				t.Fatalf("len %d cap %d, want %d", len(b), cap(b), tc.n)
			}
			if tc.n > 0 && b[0] != tc.first {
				t.Errorf("first byte %#x, want %#x", b[0], tc.first)
			}
		})
	}
}

func TestUserSliceAndUserToGuest(t *testing.T) {
	m, _ := testMemory(t)
	b, err := m.UserSlice(0x8000_0010, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, []byte{0x10, 0x11, 0x12, 0x13}) {
		t.Errorf("UserSlice bytes %x", b)
	}
	for _, tc := range []struct {
		uva uint64
		n   uint64
	}{{0x8000_0ff0, 0x11}, {0x7fff_ffff, 1}, {0x8000_0000, math.MaxUint64}, {math.MaxUint64, 1}} {
		if _, err := m.UserSlice(tc.uva, tc.n); err == nil {
			t.Errorf("UserSlice(%#x, %#x) accepted", tc.uva, tc.n)
		}
	}
	for _, tc := range []struct {
		uva, gpa uint64
		ok       bool
	}{
		{0x9000_0000, 0x1000, true},
		{0x8000_0fff, 0x2fff, true},
		{0x7000_0800, 0x10800, true},
		{0x8000_1000, 0, false},
		{0, 0, false},
	} {
		gpa, ok := m.UserToGuest(tc.uva)
		if ok != tc.ok || gpa != tc.gpa {
			t.Errorf("UserToGuest(%#x) = %#x,%v want %#x,%v", tc.uva, gpa, ok, tc.gpa, tc.ok)
		}
	}
}

func TestAppendGuestIovecs(t *testing.T) {
	m, _ := testMemory(t)
	prefix := [][]byte{[]byte("keep")}
	for _, tc := range []struct {
		name string
		gpa  uint64
		n    uint64
		lens []int // nil: error
	}{
		{"one region", 0x1100, 0x20, []int{0x20}},
		{"spans adjacent", 0x1ff0, 0x20, []int{0x10, 0x10}},
		{"both whole regions", 0x1000, 0x2000, []int{0x1000, 0x1000}},
		{"into the hole", 0x2ff0, 0x20, nil},
		{"starts in hole", 0x3000, 1, nil},
		{"wraps", 0x1000, math.MaxUint64, nil},
		{"wraps exactly to zero", math.MaxUint64, 2, nil},
		{"zero length", 0x5000, 0, []int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := append([][]byte(nil), prefix...)
			out, err := m.AppendGuestIovecs(dst, tc.gpa, tc.n)
			if tc.lens == nil {
				if err == nil {
					t.Fatal("accepted")
				}
				if len(out) != 1 {
					t.Fatalf("dst length %d after error, want 1", len(out))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != 1+len(tc.lens) || string(out[0]) != "keep" {
				t.Fatalf("got %d slices", len(out))
			}
			gpa := tc.gpa
			for i, l := range tc.lens {
				s := out[1+i]
				if len(s) != l {
					t.Fatalf("slice %d len %d, want %d", i, len(s), l)
				}
				// Pattern: byte(offset in region); all regions are 0x1000-aligned.
				if s[0] != byte(gpa&0xfff) {
					t.Errorf("slice %d first byte %#x, want %#x", i, s[0], byte(gpa))
				}
				gpa += uint64(l)
			}
		})
	}
}

func memfd(t *testing.T, size int64) int {
	t.Helper()
	fd, err := unix.MemfdCreate("vq-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	return fd
}

func TestMapRegionUnalignedOffset(t *testing.T) {
	page := uint64(os.Getpagesize())
	fd := memfd(t, int64(4*page))
	for _, off := range []uint64{0, 100, page, page + 100, 2*page - 1} {
		spec := virtqueue.RegionSpec{GuestAddr: 0x100000, Size: 300, UserAddr: 0x5000, MmapOffset: off}
		want := []byte("hello from the front-end")
		if _, err := unix.Pwrite(fd, want, int64(off)); err != nil {
			t.Fatal(err)
		}
		r, err := virtqueue.MapRegion(fd, spec)
		if err != nil {
			t.Fatalf("offset %d: %v", off, err)
		}
		b := r.Bytes()
		if len(b) != 300 || cap(b) != 300 {
			t.Fatalf("offset %d: len %d cap %d", off, len(b), cap(b))
		}
		if !bytes.Equal(b[:len(want)], want) {
			t.Errorf("offset %d: mapped bytes %q", off, b[:len(want)])
		}
		// Writes are shared (MAP_SHARED), landing at the unaligned offset.
		copy(b[200:], "back")
		got := make([]byte, 4)
		if _, err := unix.Pread(fd, got, int64(off+200)); err != nil {
			t.Fatal(err)
		}
		if string(got) != "back" {
			t.Errorf("offset %d: write not shared: %q", off, got)
		}
		if r.Spec() != spec {
			t.Errorf("Spec() = %+v", r.Spec())
		}
		if err := r.Unmap(); err != nil {
			t.Fatal(err)
		}
		if err := r.Unmap(); err != nil {
			t.Fatalf("second Unmap: %v", err)
		}
		if r.Bytes() != nil {
			t.Error("Bytes after Unmap not nil")
		}
	}
}

func TestMapRegionErrors(t *testing.T) {
	fd := memfd(t, 4096)
	if _, err := virtqueue.MapRegion(-1, virtqueue.RegionSpec{Size: 4096}); err == nil {
		t.Error("bad fd accepted")
	}
	if _, err := virtqueue.MapRegion(fd, virtqueue.RegionSpec{Size: 0}); err == nil {
		t.Error("empty region accepted")
	}
	if _, err := virtqueue.MapRegion(fd, virtqueue.RegionSpec{GuestAddr: math.MaxUint64, Size: 4096}); err == nil {
		t.Error("wrapping region accepted")
	}
}

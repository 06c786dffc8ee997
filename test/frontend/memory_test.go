package frontend

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMemoryLayouts(t *testing.T) {
	for _, c := range []struct {
		layout Layout
		want   []Region // UserAddr checked relative to the first region
	}{
		{LayoutSingle, []Region{{0, 4 << 20, 0, 0}}},
		{LayoutPCHole, []Region{{0, 0xa0000, 0, 0}, {0xc0000, 4<<20 - 0xc0000, 0xc0000, 0xc0000}}},
		{LayoutAdjacent, []Region{{0, 2 << 20, 0, 0}, {2 << 20, 2 << 20, 2 << 20, 2 << 20}}},
	} {
		m, err := NewMemory(4<<20, c.layout)
		if err != nil {
			t.Fatal(err)
		}
		regs := m.Regions()
		if len(regs) != len(c.want) {
			t.Fatalf("layout %d: %d regions", c.layout, len(regs))
		}
		base := regs[0].UserAddr
		for i, r := range regs {
			w := c.want[i]
			if r.GuestAddr != w.GuestAddr || r.Size != w.Size || r.MmapOffset != w.MmapOffset || r.UserAddr-base != w.UserAddr {
				t.Errorf("layout %d region %d: %+v", c.layout, i, r)
			}
		}
		m.Close()
	}
}

func TestMemoryAllocFree(t *testing.T) {
	m, err := NewMemory(1<<20, LayoutPCHole)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	total := m.FreeBytes()
	var got []uint64
	for i := 0; i < 200; i++ {
		gpa, err := m.Alloc(3000, 64)
		if err != nil {
			t.Fatal(err)
		}
		if gpa%64 != 0 {
			t.Fatalf("misaligned %#x", gpa)
		}
		if gpa < 0xc0000 && gpa+3000 > 0xa0000 {
			t.Fatalf("allocation %#x crosses the pc hole", gpa)
		}
		if _, err := m.Slice(gpa, 3000); err != nil {
			t.Fatalf("allocation not in one region: %v", err)
		}
		got = append(got, gpa)
	}
	if got[0] < pageSize {
		t.Fatalf("page 0 handed out: %#x", got[0])
	}
	for i := 0; i < len(got); i += 2 {
		m.Free(got[i], 3000)
	}
	for i := 1; i < len(got); i += 2 {
		m.Free(got[i], 3000)
	}
	if m.FreeBytes() != total {
		t.Fatalf("free bytes %d after freeing all, want %d", m.FreeBytes(), total)
	}
	if _, err := m.Alloc(2<<20, 8); err == nil {
		t.Fatal("allocation larger than memory succeeded")
	}
}

func TestMemorySpanningAccess(t *testing.T) {
	m, err := NewMemory(1<<20, LayoutAdjacent)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	boundary := m.Regions()[1].GuestAddr
	data := frameOf(100, 3)
	if err := m.Write(boundary-50, data); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, 100)
	if err := m.Read(boundary-50, back); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("read back: %v", err)
	}
	if _, err := m.Slice(boundary-50, 100); err == nil {
		t.Fatal("Slice across regions allowed")
	}
	if _, err := m.UserAddr(1 << 30); err == nil {
		t.Fatal("UserAddr outside memory allowed")
	}
	ua, _ := m.UserAddr(boundary + 8)
	if ua != m.Regions()[1].UserAddr+8 {
		t.Fatalf("user addr %#x", ua)
	}
}

func TestMemoryGrow(t *testing.T) {
	m, err := NewMemory(1<<20, LayoutPCHole)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := m.Grow(100000)
	if err != nil {
		t.Fatal(err)
	}
	if r.GuestAddr != 1<<30 || r.Size != 102400 || r.MmapOffset != 1<<20 || len(m.Regions()) != 3 {
		t.Fatalf("grown region %+v, %d regions", r, len(m.Regions()))
	}
	gpa, err := m.AllocIn(2, 4096, 8)
	if err != nil || gpa < r.GuestAddr {
		t.Fatalf("alloc in grown region: %#x %v", gpa, err)
	}
	data := frameOf(4096, 1)
	if err := m.Write(gpa, data); err != nil {
		t.Fatal(err)
	}
	// The same bytes are visible through the memfd at the region's offset,
	// which is what the back-end maps.
	back := make([]byte, 4096)
	if _, err := unix.Pread(m.FD(), back, int64(r.MmapOffset+gpa-r.GuestAddr)); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("memfd contents differ: %v", err)
	}
	ua, _ := m.UserAddr(gpa)
	if ua != r.UserAddr+gpa-r.GuestAddr {
		t.Fatalf("user addr %#x", ua)
	}
}

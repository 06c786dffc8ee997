package virtqueue_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

func TestNewSplitQueueValidates(t *testing.T) {
	r := newRig(t, rigOpt{size: 8})
	base := r.cfg
	u := uint64(vqtest.UserBase)
	for _, tc := range []struct {
		name string
		mod  func(c *virtqueue.Config)
	}{
		{"size 0", func(c *virtqueue.Config) { c.Size = 0 }},
		{"size 3", func(c *virtqueue.Config) { c.Size = 3 }},
		{"size 48", func(c *virtqueue.Config) { c.Size = 48 }},
		{"no memory", func(c *virtqueue.Config) { c.Mem = nil }},
		{"desc misaligned", func(c *virtqueue.Config) { c.Addr.Desc += 8 }},
		{"avail misaligned", func(c *virtqueue.Config) { c.Addr.Avail++ }},
		{"used misaligned", func(c *virtqueue.Config) { c.Addr.Used += 2 }},
		{"desc outside memory", func(c *virtqueue.Config) { c.Addr.Desc = u + rigMem - 64 }},
		{"avail guest-physical", func(c *virtqueue.Config) { c.Addr.Avail = rigRing }},
		{"used past the end", func(c *virtqueue.Config) { c.Addr.Used = u + rigMem - 4*16 }},
		{"used event past the end", func(c *virtqueue.Config) {
			c.EventIdx = true
			c.Addr.Used = u + rigMem - (4 + 8*8)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mod(&c)
			if q, err := virtqueue.NewSplitQueue(c); err == nil {
				t.Fatalf("accepted: %+v", q)
			}
		})
	}
	// Without EVENT_IDX the trailing avail_event is not needed.
	c := base
	c.Addr.Used = u + rigMem - (4 + 8*8)
	if _, err := virtqueue.NewSplitQueue(c); err != nil {
		t.Fatalf("ring ending at the region end: %v", err)
	}
	for _, size := range []uint16{1, 2, 1024, 32768} {
		g, err := vqtest.NewFlatMemory(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		d := vqtest.NewDriver(g, size, 0, 0, 0)
		c := d.Config(true, true)
		c.Logger = quiet
		if _, err := virtqueue.NewSplitQueue(c); err != nil {
			t.Errorf("size %d: %v", size, err)
		}
		g.Close()
	}
}

// A region whose mmap offset is odd puts an aligned front-end address at an
// odd host address: atomics there would be unaligned, so it is refused.
func TestNewSplitQueueHostAlignment(t *testing.T) {
	g, err := vqtest.NewGuestMemory(virtqueue.RegionSpec{GuestAddr: 0, Size: 0x10000, UserAddr: 0x40000, MmapOffset: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	d := vqtest.NewDriver(g, 8, 0x1000, 0x2000, 0x1000)
	if _, err := virtqueue.NewSplitQueue(d.Config(false, false)); err == nil {
		t.Fatal("ring at odd host address accepted")
	}
}

func TestPopDirectAndIndirect(t *testing.T) {
	r := newRig(t, rigOpt{size: 16, indirect: true})
	d := r.d
	hdr, frame, rx := d.Alloc(12), d.Alloc(100), d.Alloc(1500)
	r.fill(hdr, 12, 0)
	r.fill(frame, 100, 0x40)

	// 1: one readable descriptor.
	h1, _ := d.AddChain(vqtest.Buf{GPA: frame, Len: 100})
	// 2: header + frame readable, then a writable buffer.
	h2, _ := d.AddChain(vqtest.Buf{GPA: hdr, Len: 12}, vqtest.Buf{GPA: frame, Len: 100}, vqtest.Buf{GPA: rx, Len: 1500, Write: true})
	// 3: indirect table with the same three buffers, chained out of order.
	tbl := d.Alloc(3 * 16)
	tb := r.g.Bytes(tbl, 48)
	vqtest.PutDesc(tb, 0, hdr, 12, virtqueue.DescFlagNext, 2)
	vqtest.PutDesc(tb, 2, frame, 100, virtqueue.DescFlagNext, 1)
	vqtest.PutDesc(tb, 1, rx, 1500, virtqueue.DescFlagWrite, 0)
	d.SetDesc(10, tbl, 48, virtqueue.DescFlagIndirect, 0)
	d.PutAvail(10)
	// 4: a direct readable descriptor followed by an indirect one.
	tbl2 := d.Alloc(16)
	vqtest.PutDesc(r.g.Bytes(tbl2, 16), 0, rx, 64, virtqueue.DescFlagWrite, 0)
	d.SetDesc(11, hdr, 12, virtqueue.DescFlagNext, 12)
	d.SetDesc(12, tbl2, 16, virtqueue.DescFlagIndirect, 0)
	d.PutAvail(11)
	d.Publish(false)

	want := []struct {
		head           uint16
		nr, nw, rl, wl int
		descs          int
		read           []byte
	}{
		{h1, 1, 0, 100, 0, 1, r.g.Bytes(frame, 100)},
		{h2, 2, 1, 112, 1500, 3, append(append([]byte{}, r.g.Bytes(hdr, 12)...), r.g.Bytes(frame, 100)...)},
		{10, 2, 1, 112, 1500, 3, append(append([]byte{}, r.g.Bytes(hdr, 12)...), r.g.Bytes(frame, 100)...)},
		{11, 1, 1, 12, 64, 2, r.g.Bytes(hdr, 12)},
	}
	var c virtqueue.Chain
	for i, w := range want {
		if !r.pop(t, &c) {
			t.Fatalf("chain %d: ring empty", i)
		}
		if c.Head != w.head || len(c.Readable) != w.nr || len(c.Writable) != w.nw ||
			c.ReadableLen() != w.rl || c.WritableLen() != w.wl || c.Descriptors() != w.descs {
			t.Fatalf("chain %d: head %d, %d/%d segments, %d/%d bytes, %d descs; want %+v",
				i, c.Head, len(c.Readable), len(c.Writable), c.ReadableLen(), c.WritableLen(), c.Descriptors(), w)
		}
		if !bytes.Equal(flat(c.Readable), w.read) {
			t.Errorf("chain %d: readable bytes differ", i)
		}
		if w.nw > 0 {
			// Writable buffers alias guest memory.
			c.Writable[0][0] = 0xee
			if r.g.Bytes(rx, 1)[0] != 0xee {
				t.Errorf("chain %d: writable buffer does not alias guest memory", i)
			}
			if cap(c.Readable) != len(c.Readable) {
				t.Errorf("chain %d: Readable has spare capacity over Writable", i)
			}
		}
		r.q.Push(c.Head, uint32(c.WritableLen()))
	}
	if r.pop(t, &c) {
		t.Fatal("ring not empty")
	}
	r.q.Flush()
	used := d.Reclaim()
	if len(used) != 4 {
		t.Fatalf("%d used", len(used))
	}
	for i, w := range want {
		if used[i].ID != uint32(w.head) || used[i].Len != uint32(w.wl) {
			t.Errorf("used %d = %+v, want head %d len %d", i, used[i], w.head, w.wl)
		}
	}
	if got := r.stats.Chains.Load(); got != 4 {
		t.Errorf("Chains = %d", got)
	}
	if got := r.stats.BadChains.Load(); got != 0 {
		t.Errorf("BadChains = %d", got)
	}
}

func TestPopSpansRegions(t *testing.T) {
	// Guest RAM in two adjacent regions at unrelated memfd offsets.
	g, err := vqtest.NewGuestMemory(
		virtqueue.RegionSpec{GuestAddr: 0, Size: 0x10000, UserAddr: 0x7000_0000, MmapOffset: 0x20000},
		virtqueue.RegionSpec{GuestAddr: 0x10000, Size: 0x10000, UserAddr: 0x5000_0000, MmapOffset: 0},
	)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	d := vqtest.NewDriver(g, 8, 0x1000, 0x2000, 0)
	copy(g.Bytes(0xfff0, 16), "0123456789abcdef")
	copy(g.Bytes(0x10000, 16), "ghijklmnopqrstuv")
	d.AddChain(vqtest.Buf{GPA: 0xfff0, Len: 32})
	d.Publish(false)
	q, err := virtqueue.NewSplitQueue(d.Config(false, false))
	if err != nil {
		t.Fatal(err)
	}
	var c virtqueue.Chain
	if ok, err := q.Pop(&c); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if len(c.Readable) != 2 || string(flat(c.Readable)) != "0123456789abcdefghijklmnopqrstuv" {
		t.Fatalf("readable %q in %d segments", flat(c.Readable), len(c.Readable))
	}
}

// hostile sets up descriptors (and optionally memory) for one chain with
// head 0. Every case must end as a bad chain.
type hostile struct {
	name     string
	indirect bool
	setup    func(r *rig)
}

func hostileCases() []hostile {
	const F, W, I = virtqueue.DescFlagNext, virtqueue.DescFlagWrite, virtqueue.DescFlagIndirect
	ok := uint64(rigData)
	tbl := uint64(rigData + 0x8000)
	put := func(r *rig, i int, addr uint64, l uint32, flags, next uint16) {
		vqtest.PutDesc(r.g.Bytes(tbl, 0x8000), i, addr, l, flags, next)
	}
	return []hostile{
		{"self loop", false, func(r *rig) { r.d.SetDesc(0, ok, 1, F, 0) }},
		{"two-descriptor loop", false, func(r *rig) {
			r.d.SetDesc(0, ok, 1, F, 1)
			r.d.SetDesc(1, ok, 1, F, 0)
		}},
		{"loop through the whole ring", false, func(r *rig) {
			for i := range uint16(15) { // 15 is the good chain
				r.d.SetDesc(i, ok, 1, F, (i+1)%15)
			}
		}},
		{"next out of range", false, func(r *rig) { r.d.SetDesc(0, ok, 1, F, 16) }},
		{"next 0xffff", false, func(r *rig) { r.d.SetDesc(0, ok, 1, F, 0xffff) }},
		{"address outside memory", false, func(r *rig) { r.d.SetDesc(0, rigMem, 1, 0, 0) }},
		{"buffer past the end of memory", false, func(r *rig) { r.d.SetDesc(0, rigMem-10, 11, 0, 0) }},
		{"len 0xffffffff", false, func(r *rig) { r.d.SetDesc(0, 0, 0xffffffff, 0, 0) }},
		{"address+len wraps", false, func(r *rig) { r.d.SetDesc(0, 0xffff_ffff_ffff_fff0, 0x100, 0, 0) }},
		{"second descriptor outside memory", false, func(r *rig) {
			r.d.SetDesc(0, ok, 1, F, 1)
			r.d.SetDesc(1, 1<<40, 1, W, 0)
		}},
		{"read after write", false, func(r *rig) {
			r.d.SetDesc(0, ok, 1, W|F, 1)
			r.d.SetDesc(1, ok, 1, 0, 0)
		}},
		{"too many segments", false, func(r *rig) {
			// 129 one-byte descriptors would fit a ring of 256 but not a Chain.
		}},
		{"indirect not negotiated", false, func(r *rig) {
			put(r, 0, ok, 1, 0, 0)
			r.d.SetDesc(0, tbl, 16, I, 0)
		}},
		{"indirect with next", true, func(r *rig) {
			put(r, 0, ok, 1, 0, 0)
			r.d.SetDesc(0, tbl, 16, I|F, 1)
			r.d.SetDesc(1, ok, 1, 0, 0)
		}},
		{"nested indirect", true, func(r *rig) {
			put(r, 0, tbl+16, 16, I, 0)
			put(r, 1, ok, 1, 0, 0)
			r.d.SetDesc(0, tbl, 32, I, 0)
		}},
		{"indirect table len 0", true, func(r *rig) { r.d.SetDesc(0, tbl, 0, I, 0) }},
		{"indirect table odd size", true, func(r *rig) {
			put(r, 0, ok, 1, 0, 0)
			r.d.SetDesc(0, tbl, 24, I, 0)
		}},
		{"indirect table too long", true, func(r *rig) {
			for i := range 1025 {
				put(r, i, ok, 1, F, uint16(i+1))
			}
			r.d.SetDesc(0, tbl, 1025*16, I, 0)
		}},
		{"indirect table outside memory", true, func(r *rig) { r.d.SetDesc(0, rigMem-16, 32, I, 0) }},
		{"indirect loop", true, func(r *rig) {
			put(r, 0, ok, 1, F, 1)
			put(r, 1, ok, 1, F, 0)
			r.d.SetDesc(0, tbl, 32, I, 0)
		}},
		{"indirect next out of range", true, func(r *rig) {
			put(r, 0, ok, 1, F, 2)
			r.d.SetDesc(0, tbl, 32, I, 0)
		}},
		{"indirect read after write", true, func(r *rig) {
			put(r, 0, ok, 1, W|F, 1)
			put(r, 1, ok, 1, 0, 0)
			r.d.SetDesc(0, tbl, 32, I, 0)
		}},
		{"direct write then indirect read", true, func(r *rig) {
			put(r, 0, ok, 1, 0, 0)
			r.d.SetDesc(0, ok, 1, W|F, 1)
			r.d.SetDesc(1, tbl, 16, I, 0)
		}},
		{"indirect buffer outside memory", true, func(r *rig) {
			put(r, 0, ok, 1, F, 1)
			put(r, 1, rigMem, 1, W, 0)
			r.d.SetDesc(0, tbl, 32, I, 0)
		}},
		{"indirect segments overflow", true, func(r *rig) {
			for i := range 200 {
				put(r, i, ok, 1, F, uint16(i+1))
			}
			put(r, 199, ok, 1, 0, 0)
			r.d.SetDesc(0, tbl, 200*16, I, 0)
		}},
	}
}

func TestHostileChains(t *testing.T) {
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			size := uint16(16)
			if tc.name == "too many segments" {
				size = 256
			}
			r := newRig(t, rigOpt{size: size, indirect: tc.indirect, call: true})
			if tc.name == "too many segments" {
				for i := range uint16(virtqueue.MaxChainSegments + 1) {
					r.d.SetDesc(i, rigData+uint64(i)*2, 1, virtqueue.DescFlagNext, i+1)
				}
				r.d.SetDesc(virtqueue.MaxChainSegments, rigData, 1, 0, 0)
			}
			tc.setup(r)
			r.d.PutAvail(0)
			// A good chain behind the bad one must still come out.
			good := uint16(size - 1)
			r.d.SetDesc(good, rigData, 8, 0, 0)
			r.d.PutAvail(good)
			r.d.Publish(false)

			var c virtqueue.Chain
			ok, err := r.q.Pop(&c)
			if err != nil || !ok || c.Head != good || c.ReadableLen() != 8 {
				t.Fatalf("Pop = %v, %v, head %d len %d; want the good chain %d", ok, err, c.Head, c.ReadableLen(), good)
			}
			if n := r.stats.BadChains.Load(); n != 1 {
				t.Fatalf("BadChains = %d, want 1", n)
			}
			if r.d.UsedIdx() != 0 {
				t.Fatal("bad chain published before Flush")
			}
			r.q.Push(c.Head, 0)
			r.q.Flush()
			used := r.d.Reclaim()
			if len(used) != 2 || used[0] != (vqtest.Used{ID: 0, Len: 0}) || used[1].ID != uint32(good) {
				t.Fatalf("used = %+v", used)
			}
			if ok, err := r.q.Pop(&c); ok || err != nil {
				t.Fatalf("ring not empty: %v %v", ok, err)
			}
			if r.stats.Chains.Load() != 1 {
				t.Errorf("Chains = %d", r.stats.Chains.Load())
			}
		})
	}
}

// Zero-length descriptors are tolerated and contribute no segment.
func TestZeroLengthDescriptor(t *testing.T) {
	r := newRig(t, rigOpt{})
	r.d.SetDesc(0, 0xdead_0000_0000, 0, virtqueue.DescFlagNext, 1)
	r.d.SetDesc(1, rigData, 4, 0, 0)
	r.d.PutAvail(0)
	r.d.Publish(false)
	var c virtqueue.Chain
	if !r.pop(t, &c) || len(c.Readable) != 1 || c.ReadableLen() != 4 || c.Descriptors() != 2 {
		t.Fatalf("chain %+v", c.Readable)
	}
}

// MaxChainBytes refuses a descriptor of 0xffffffff bytes even when guest
// memory is large enough to hold it.
func TestChainBytesLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("maps 4.5 GiB of sparse memory")
	}
	g, err := vqtest.NewFlatMemory(4<<30 + 1<<29)
	if err != nil {
		t.Skip(err)
	}
	defer g.Close()
	d := vqtest.NewDriver(g, 8, 0x1000, 0, 0)
	cfg := d.Config(false, false)
	cfg.Logger = quiet
	st := new(virtqueue.Stats)
	cfg.Stats = st
	q, err := virtqueue.NewSplitQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.SetDesc(0, 0x10000, 0xffffffff, 0, 0)
	d.SetDesc(1, 0x10000, 0x7fffffff, virtqueue.DescFlagNext, 2)
	d.SetDesc(2, 0x10000, 1, 0, 0)
	d.SetDesc(3, 0x10000, 0x7fffffff, 0, 0)
	d.PutAvail(0)
	d.PutAvail(1)
	d.PutAvail(3)
	d.Publish(false)
	var c virtqueue.Chain
	ok, err := q.Pop(&c)
	if !ok || err != nil || c.Head != 3 || c.ReadableLen() != 0x7fffffff {
		t.Fatalf("Pop = %v %v head %d", ok, err, c.Head)
	}
	if st.BadChains.Load() != 2 {
		t.Fatalf("BadChains = %d, want 2", st.BadChains.Load())
	}
}

func TestAvailIdxRunsAhead(t *testing.T) {
	for _, tc := range []struct {
		name   string
		avail  uint16
		last   uint16
		broken bool
	}{
		{"exactly size pending", 8, 0, false},
		{"size+1 pending", 9, 0, true},
		{"behind last avail", 0xffff, 0, true},
		{"wrapping, size pending", 3, 0xfffb, false},
		{"wrapping, size+1 pending", 4, 0xfffb, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOpt{size: 8, lastAvail: tc.last})
			for i := range uint16(8) {
				r.d.SetDesc(i, rigData, 1, 0, 0)
				binaryPutAvail(r, tc.last+i, i)
			}
			r.d.SetAvailIdx(tc.avail)
			var c virtqueue.Chain
			n := 0
			for {
				ok, err := r.q.Pop(&c)
				if err != nil {
					if !tc.broken || !errors.Is(err, virtqueue.ErrBroken) {
						t.Fatalf("Pop: %v", err)
					}
					break
				}
				if !ok {
					break
				}
				n++
			}
			if tc.broken {
				if n != 0 {
					t.Fatalf("%d chains popped from a broken ring", n)
				}
				// Broken forever, even once the index looks sane again.
				r.d.SetAvailIdx(tc.last + 1)
				if _, err := r.q.Pop(&c); !errors.Is(err, virtqueue.ErrBroken) {
					t.Fatalf("second Pop: %v", err)
				}
				return
			}
			if n != int(tc.avail-tc.last) {
				t.Fatalf("popped %d", n)
			}
		})
	}
}

// binaryPutAvail writes avail ring slot idx (mod size) = head.
func binaryPutAvail(r *rig, idx, head uint16) {
	b := r.g.Bytes(r.d.AvailGPA+4+2*uint64(idx&(r.d.Size-1)), 2)
	b[0], b[1] = byte(head), byte(head>>8)
}

func TestHeadOutOfRangeBreaks(t *testing.T) {
	r := newRig(t, rigOpt{size: 8})
	r.d.PutAvail(8)
	r.d.Publish(false)
	var c virtqueue.Chain
	if _, err := r.q.Pop(&c); !errors.Is(err, virtqueue.ErrBroken) {
		t.Fatalf("Pop: %v", err)
	}
}

func TestNeedEvent(t *testing.T) {
	for _, tc := range []struct {
		event, next, old uint16
		want             bool
	}{
		{0, 1, 0, true},           // driver waits for the first element
		{0, 2, 1, false},          // already past event
		{5, 5, 4, false},          // event not reached: needs next > event
		{5, 6, 5, true},           // crossing event
		{5, 10, 0, true},          // batch crosses event
		{5, 5, 0, false},          // batch stops just before
		{0xffff, 0, 0xfffe, true}, // wrap: event at 0xffff crossed by 0xfffe->0
		{0xffff, 0xffff, 0xfffe, false},
		{2, 3, 0xfff0, true},       // wrap across zero
		{0xfff0, 3, 0xfff5, false}, // event long behind
		{7, 7, 7, false},           // nothing published
	} {
		if got := virtqueue.NeedEvent(tc.event, tc.next, tc.old); got != tc.want {
			t.Errorf("NeedEvent(event %d, next %d, old %d) = %v, want %v", tc.event, tc.next, tc.old, got, tc.want)
		}
	}
}

// offerN offers n one-descriptor readable chains and returns their heads.
func offerN(t *testing.T, r *rig, n int) []uint16 {
	t.Helper()
	var heads []uint16
	for range n {
		h, err := r.d.AddChain(vqtest.Buf{GPA: r.d.Alloc(64), Len: 64})
		if err != nil {
			t.Fatal(err)
		}
		heads = append(heads, h)
	}
	r.d.Publish(false)
	return heads
}

func TestFlushNotifications(t *testing.T) {
	type step struct {
		pushes     int
		usedEvent  int // -1: leave
		availFlags int // -1: leave
		notify     bool
	}
	for _, tc := range []struct {
		name     string
		eventIdx bool
		steps    []step
	}{
		{"no event idx, interrupts on", false, []step{{1, -1, 0, true}, {3, -1, 0, true}}},
		{"no event idx, NO_INTERRUPT", false, []step{{2, -1, virtqueue.AvailFlagNoInterrupt, false}, {1, -1, 0, true}}},
		{"event idx", true, []step{
			{1, 0, -1, true},  // used 0->1 crosses event 0
			{1, 0, -1, false}, // 1->2: event 0 already passed
			{2, 3, -1, true},  // 2->4: event 3 is in [2,4)
		}},
		{"event idx ahead", true, []step{
			{1, 5, -1, false}, // 0->1
			{4, 5, -1, false}, // 1->5, event 5 not crossed
			{1, 5, -1, true},  // 5->6 crosses
		}},
		{"event idx ignores flags", true, []step{{1, 0, virtqueue.AvailFlagNoInterrupt, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOpt{size: 16, eventIdx: tc.eventIdx, call: true})
			var notifies, suppressed uint64
			for i, s := range tc.steps {
				heads := offerN(t, r, s.pushes)
				var c virtqueue.Chain
				for range heads {
					if !r.pop(t, &c) {
						t.Fatal("empty")
					}
					r.q.Push(c.Head, 0)
				}
				if s.usedEvent >= 0 {
					r.d.SetUsedEvent(uint16(s.usedEvent))
				}
				if s.availFlags >= 0 {
					r.d.SetAvailFlags(uint16(s.availFlags))
				}
				r.q.Flush()
				got := readEventfd(t, r.cfg.Call)
				if s.notify {
					notifies++
					if got != 1 {
						t.Fatalf("step %d: call counter %d, want 1", i, got)
					}
				} else {
					suppressed++
					if got != 0 {
						t.Fatalf("step %d: signalled, want suppressed", i)
					}
				}
				if r.stats.Notifies.Load() != notifies || r.stats.NotifiesSuppressed.Load() != suppressed {
					t.Fatalf("step %d: Notifies %d Suppressed %d, want %d %d", i,
						r.stats.Notifies.Load(), r.stats.NotifiesSuppressed.Load(), notifies, suppressed)
				}
				r.d.Reclaim()
			}
		})
	}
}

func TestFlushBatches(t *testing.T) {
	r := newRig(t, rigOpt{size: 16, call: true})
	heads := offerN(t, r, 5)
	var c virtqueue.Chain
	for i := range heads {
		if !r.pop(t, &c) {
			t.Fatal("empty")
		}
		r.q.Push(c.Head, uint32(10+i))
		if r.d.UsedIdx() != 0 {
			t.Fatalf("used.idx moved to %d before Flush", r.d.UsedIdx())
		}
	}
	if r.q.Staged() != 5 {
		t.Fatalf("Staged = %d", r.q.Staged())
	}
	r.q.Flush()
	if r.d.UsedIdx() != 5 || r.q.Staged() != 0 {
		t.Fatalf("used.idx %d staged %d after Flush", r.d.UsedIdx(), r.q.Staged())
	}
	for i, h := range heads {
		if u := r.d.UsedElem(uint16(i)); u.ID != uint32(h) || u.Len != uint32(10+i) {
			t.Errorf("used %d = %+v, want head %d len %d", i, u, h, 10+i)
		}
	}
	if r.stats.UsedPublished.Load() != 5 || r.stats.Notifies.Load() != 1 || readEventfd(t, r.cfg.Call) != 1 {
		t.Fatalf("UsedPublished %d Notifies %d", r.stats.UsedPublished.Load(), r.stats.Notifies.Load())
	}
	// Nothing staged: no store, no signal, no counters.
	r.q.Flush()
	if r.stats.Notifies.Load() != 1 || r.stats.NotifiesSuppressed.Load() != 0 || readEventfd(t, r.cfg.Call) != 0 {
		t.Fatal("empty Flush signalled or counted")
	}
	// Push of a head outside the ring is ignored.
	r.q.Push(16, 1)
	if r.q.Staged() != 0 {
		t.Fatal("Push of an invalid head staged")
	}
}

// Staging more than Size elements flushes rather than overwriting.
func TestPushOverflowFlushes(t *testing.T) {
	r := newRig(t, rigOpt{size: 4})
	for i := range 6 {
		r.q.Push(uint16(i%4), uint32(i))
	}
	if r.d.UsedIdx() != 4 || r.q.Staged() != 2 {
		t.Fatalf("used.idx %d staged %d", r.d.UsedIdx(), r.q.Staged())
	}
	r.q.Flush()
	if r.d.UsedIdx() != 6 {
		t.Fatalf("used.idx %d", r.d.UsedIdx())
	}
	for i := 2; i < 6; i++ { // slots of 0 and 1 were consumed and reused
		if u := r.d.UsedElem(uint16(i)); u.Len != uint32(i) {
			t.Errorf("used %d = %+v", i, u)
		}
	}
}

func TestUsedIdxFromRing(t *testing.T) {
	r := newRig(t, rigOpt{size: 8, usedIdxBefore: 0xfffe, lastAvail: 0xfffe})
	if r.q.LastAvail() != 0xfffe {
		t.Fatal(r.q.LastAvail())
	}
	r.q.Push(3, 7)
	r.q.Push(4, 8)
	r.q.Flush()
	if r.d.UsedIdx() != 0 {
		t.Fatalf("used.idx %#x, want 0 (wrapped from 0xfffe)", r.d.UsedIdx())
	}
	if u := r.d.UsedElem(0xfffe); u != (vqtest.Used{ID: 3, Len: 7}) {
		t.Fatalf("used elem %+v", u)
	}
}

func TestUnpop(t *testing.T) {
	r := newRig(t, rigOpt{size: 16})
	heads := offerN(t, r, 4)
	var c virtqueue.Chain
	for range 3 {
		r.pop(t, &c)
	}
	r.q.Unpop(2)
	if r.q.LastAvail() != 1 {
		t.Fatalf("LastAvail %d after Unpop(2)", r.q.LastAvail())
	}
	for _, want := range heads[1:] {
		if !r.pop(t, &c) || c.Head != want {
			t.Fatalf("after Unpop: head %d, want %d", c.Head, want)
		}
	}
	// Clamped to what was popped; invalid n ignored.
	r.q.Unpop(-3)
	r.q.Unpop(0)
	if r.q.LastAvail() != 4 {
		t.Fatal("Unpop(<=0) moved LastAvail")
	}
	r.q.Unpop(100)
	if r.q.LastAvail() != 0 {
		t.Fatalf("Unpop(100) LastAvail %d, want 0", r.q.LastAvail())
	}
	r.q.Unpop(1)
	if r.q.LastAvail() != 0 {
		t.Fatal("Unpop rewound beyond the first chain")
	}
	if r.stats.Chains.Load() != 4 { // re-popped chains count once
		t.Errorf("Chains %d", r.stats.Chains.Load())
	}
}

// newRigBadBetween is a 16-entry ring holding good chain a, a bad chain
// (head 10, its buffer outside guest memory), then good chain b.
func newRigBadBetween(t *testing.T) (r *rig, a, b uint16) {
	t.Helper()
	r = newRig(t, rigOpt{size: 16})
	a, _ = r.d.AddChain(vqtest.Buf{GPA: rigData, Len: 1})
	r.d.SetDesc(10, rigMem, 1, 0, 0)
	r.d.PutAvail(10)
	b, _ = r.d.AddChain(vqtest.Buf{GPA: rigData, Len: 1})
	r.d.Publish(false)
	return r, a, b
}

// A bad chain consumed inside Pop is already returned to the guest: Unpop
// rewinds across it to the good chains, and re-Pop skips it.
func TestUnpopSkipsBadChain(t *testing.T) {
	r, a, b := newRigBadBetween(t)
	var c virtqueue.Chain
	r.pop(t, &c)
	if !r.pop(t, &c) || c.Head != b {
		t.Fatalf("head %d, want %d", c.Head, b)
	}
	r.q.Unpop(3) // clamped to the two good chains
	if r.q.LastAvail() != 0 {
		t.Fatalf("LastAvail %d, want 0", r.q.LastAvail())
	}
	for _, want := range []uint16{a, b} {
		if !r.pop(t, &c) || c.Head != want {
			t.Fatalf("re-pop head %d, want %d", c.Head, want)
		}
	}
	if r.pop(t, &c) {
		t.Fatal("ring not empty")
	}
	// Rewinding only the last chain leaves the bad one behind it alone.
	r.q.Unpop(1)
	if r.q.LastAvail() != 2 || !r.pop(t, &c) || c.Head != b {
		t.Fatalf("LastAvail %d head %d", r.q.LastAvail(), c.Head)
	}
	r.q.Push(a, 0)
	r.q.Push(b, 0)
	r.q.Flush()
	used := r.d.Reclaim()
	if len(used) != 3 || used[0].ID != 10 || r.stats.BadChains.Load() != 1 || r.stats.Chains.Load() != 2 {
		t.Fatalf("used %+v, BadChains %d, Chains %d", used, r.stats.BadChains.Load(), r.stats.Chains.Load())
	}
}

// PopSkipping counts the used entries it goes past: a bad chain it stages
// (the first time), and the same entry skipped on a re-Pop after an Unpop
// across it; none in front of the chains that follow.
func TestPopSkippingCounts(t *testing.T) {
	r, a, b := newRigBadBetween(t)
	var c virtqueue.Chain
	pop := func(wantHead uint16, wantSkipped int) {
		t.Helper()
		ok, skipped, err := r.q.PopSkipping(&c)
		if !ok || err != nil || c.Head != wantHead || skipped != wantSkipped {
			t.Fatalf("PopSkipping: ok %v err %v head %d skipped %d; want head %d skipped %d", ok, err, c.Head, skipped, wantHead, wantSkipped)
		}
	}
	pop(a, 0)
	pop(b, 1) // the bad chain, staged as used
	r.q.Unpop(2)
	pop(a, 0)
	pop(b, 1) // the same entry, already used, skipped
	if ok, skipped, err := r.q.PopSkipping(&c); ok || skipped != 0 || err != nil {
		t.Fatalf("empty ring: ok %v skipped %d err %v", ok, skipped, err)
	}
	if r.stats.BadChains.Load() != 1 {
		t.Fatalf("BadChains %d, want 1", r.stats.BadChains.Load())
	}
}

// A chain that turns bad between Pop and re-Pop is caught on the re-walk.
func TestUnpopRevalidates(t *testing.T) {
	r := newRig(t, rigOpt{size: 8})
	h, _ := r.d.AddChain(vqtest.Buf{GPA: rigData, Len: 8})
	r.d.Publish(false)
	var c virtqueue.Chain
	r.pop(t, &c)
	r.q.Unpop(1)
	r.d.SetDesc(h, rigMem, 8, 0, 0)
	if r.pop(t, &c) || r.stats.BadChains.Load() != 1 {
		t.Fatalf("changed chain popped, BadChains %d", r.stats.BadChains.Load())
	}
	r.q.Flush()
	if r.d.UsedIdx() != 1 || r.d.UsedElem(0) != (vqtest.Used{ID: uint32(h)}) {
		t.Fatalf("used %d %+v", r.d.UsedIdx(), r.d.UsedElem(0))
	}
}

func TestKicksNoEventIdx(t *testing.T) {
	r := newRig(t, rigOpt{size: 8})
	if r.d.UsedFlags() != 0 {
		t.Fatal("kicks not enabled at start")
	}
	r.q.DisableKicks()
	if r.d.UsedFlags() != virtqueue.UsedFlagNoNotify {
		t.Fatal("NO_NOTIFY not set")
	}
	if kick := r.d.Publish(false); kick {
		t.Fatal("driver would kick with NO_NOTIFY")
	}
	if r.q.EnableKicks() {
		t.Fatal("more with an empty ring")
	}
	if r.d.UsedFlags() != 0 {
		t.Fatal("NO_NOTIFY not cleared")
	}
	offerN(t, r, 1)
	r.q.DisableKicks()
	if !r.q.EnableKicks() {
		t.Fatal("EnableKicks missed a pending chain")
	}
}

// TestRearmKicks: a consumer that finds chains came while it re-enabled
// kicks goes on popping with kicks off again (without EVENT_IDX the driver
// would otherwise kick for each chain it adds meanwhile); with the ring
// empty, kicks stay on.
func TestRearmKicks(t *testing.T) {
	for _, eventIdx := range []bool{false, true} {
		t.Run(fmt.Sprintf("eventIdx=%v", eventIdx), func(t *testing.T) {
			r := newRig(t, rigOpt{size: 8, eventIdx: eventIdx})
			// offer adds a chain and publishes it as the driver does,
			// reporting whether the driver kicks.
			offer := func() bool {
				if _, err := r.d.AddChain(vqtest.Buf{GPA: r.d.Alloc(64), Len: 64}); err != nil {
					t.Fatal(err)
				}
				return r.d.Publish(eventIdx)
			}
			var c virtqueue.Chain
			r.q.DisableKicks()
			offer() // came while the consumer worked
			if !r.q.RearmKicks() {
				t.Fatal("RearmKicks missed a pending chain")
			}
			if offer() {
				t.Fatal("the driver kicks while the consumer goes on popping")
			}
			for r.pop(t, &c) {
			}
			if r.q.RearmKicks() {
				t.Fatal("more with an empty ring")
			}
			if !offer() {
				t.Fatal("no kick for a chain after the ring was found empty")
			}
		})
	}
}

// A previous back-end may have left NO_NOTIFY set; a new queue clears it.
func TestNewQueueClearsNoNotify(t *testing.T) {
	r := newRig(t, rigOpt{size: 8})
	r.q.DisableKicks()
	q2, err := virtqueue.NewSplitQueue(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = q2
	if r.d.UsedFlags() != 0 {
		t.Fatal("NO_NOTIFY survived a new queue")
	}
}

func TestKicksEventIdx(t *testing.T) {
	r := newRig(t, rigOpt{size: 8, eventIdx: true, lastAvail: 5})
	if r.d.AvailEvent() != 5 {
		t.Fatalf("avail_event %d at start, want 5", r.d.AvailEvent())
	}
	r.d.SetAvailIdx(5)
	heads := offerN(t, r, 2)
	_ = heads
	var c virtqueue.Chain
	r.pop(t, &c)
	r.pop(t, &c)
	// Popping the ring empty moves avail_event so the next offer kicks.
	if r.pop(t, &c) {
		t.Fatal("not empty")
	}
	if r.d.AvailEvent() != 7 {
		t.Fatalf("avail_event %d after draining, want 7", r.d.AvailEvent())
	}
	r.d.AddChain(vqtest.Buf{GPA: rigData, Len: 1})
	if !r.d.Publish(true) {
		t.Fatal("driver would not kick")
	}
	// Disabled: draining no longer moves avail_event, so the driver stops kicking.
	r.q.DisableKicks()
	r.pop(t, &c)
	r.pop(t, &c)
	if r.d.AvailEvent() != 7 {
		t.Fatalf("avail_event moved to %d while disabled", r.d.AvailEvent())
	}
	r.d.AddChain(vqtest.Buf{GPA: rigData, Len: 1})
	if r.d.Publish(true) {
		t.Fatal("driver would kick while kicks disabled")
	}
	if !r.q.EnableKicks() {
		t.Fatal("EnableKicks missed the pending chain")
	}
	if r.d.AvailEvent() != 8 {
		t.Fatalf("avail_event %d after EnableKicks, want 8", r.d.AvailEvent())
	}
	if r.d.UsedFlags() != 0 {
		t.Fatal("used.flags touched under EVENT_IDX")
	}
}

func TestDrainKickAndSignal(t *testing.T) {
	r := newRig(t, rigOpt{kick: true, call: true})
	if r.q.KickFD() != r.cfg.Kick {
		t.Fatal("KickFD")
	}
	if err := r.q.DrainKick(); err != nil {
		t.Fatalf("empty DrainKick: %v", err)
	}
	writeEventfd(t, r.cfg.Kick, 1)
	writeEventfd(t, r.cfg.Kick, 2)
	if err := r.q.DrainKick(); err != nil {
		t.Fatal(err)
	}
	if r.stats.Kicks.Load() != 3 {
		t.Fatalf("Kicks %d", r.stats.Kicks.Load())
	}
	if readEventfd(t, r.cfg.Kick) != 0 {
		t.Fatal("kick counter not drained")
	}
	if err := r.q.Signal(); err != nil {
		t.Fatal(err)
	}
	if readEventfd(t, r.cfg.Call) != 1 {
		t.Fatal("Signal did not write 1")
	}
	none := newRig(t, rigOpt{})
	if none.q.DrainKick() != nil || none.q.Signal() != nil || none.q.KickFD() != -1 {
		t.Fatal("queue without eventfds")
	}
}

// A hostile front-end's call fd can be a full blocking pipe (vhostuser
// refuses anything but an eventfd; the queue must not rely on that):
// Signal must not block on it, whether it reports an error or not.
func TestSignalFullBlockingPipe(t *testing.T) {
	r := newRig(t, rigOpt{size: 8})
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	unix.SetNonblock(p[1], true)
	for {
		if _, err := unix.Write(p[1], make([]byte, 4096)); err != nil {
			break
		}
	}
	unix.SetNonblock(p[1], false)
	cfg := r.cfg
	cfg.Call = p[1]
	q, err := virtqueue.NewSplitQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- q.Signal() }()
	select {
	case err := <-done:
		t.Logf("Signal on a full pipe: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Signal blocked on a full pipe")
	}
}

func TestSignalErrorCounted(t *testing.T) {
	r := newRig(t, rigOpt{size: 8})
	// A call fd whose reader is gone.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	unix.Close(p[0]) // writes now fail with EPIPE
	defer unix.Close(p[1])
	cfg := r.cfg
	cfg.Call = p[1]
	q, err := virtqueue.NewSplitQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if q.Signal() == nil {
		t.Fatal("Signal on a bad fd succeeded")
	}
	q.Push(0, 0)
	q.Flush()
	if r.stats.SignalErrors.Load() != 1 || r.stats.Notifies.Load() != 1 || r.d.UsedIdx() != 1 {
		t.Fatalf("SignalErrors %d Notifies %d used %d", r.stats.SignalErrors.Load(), r.stats.Notifies.Load(), r.d.UsedIdx())
	}
}

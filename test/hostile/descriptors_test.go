package hostile

import (
	"testing"
	"time"

	fe "vunet/test/frontend"
)

// descEnv is what a descriptor case gets: the ring under attack and some
// valid guest memory to point at.
type descEnv struct {
	f   *fe.Frontend
	r   *fe.Ring
	buf uint64 // 4 KiB of valid guest memory holding header+ARP request
	end uint64 // guest-physical end of the last region
}

// table writes descs as an indirect table in fresh guest memory.
func (e *descEnv) table(t *testing.T, descs []fe.Desc) uint64 {
	t.Helper()
	gpa, err := e.f.Mem.Alloc(uint64(len(descs))*16+16, 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.r.WriteDescTable(gpa, descs); err != nil {
		t.Fatal(err)
	}
	return gpa
}

// first descriptor index the cases write: far from the ones the driver's
// own free list hands out (from 0 upward).
const d0 = 100

const (
	next     = fe.DescFNext
	write    = fe.DescFWrite
	indirect = fe.DescFIndirect
)

type descCase struct {
	name string
	opts fe.Options
	rx   bool // attack the RX ring (ring 0) instead of TX (ring 1)
	// build writes raw descriptors and returns the heads to make available.
	build func(t *testing.T, e *descEnv) []uint16
	// broken: the chain breaks the whole queue (nothing is returned used).
	broken bool
	// tolerated: odd but not necessarily malformed; the chain must come
	// back used, but neither its length nor the bad-chain counter is checked.
	tolerated bool
	// raw: the case sets avail.idx itself.
	raw bool
}

var descCases = []descCase{
	{name: "self loop", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.buf, Len: 64, Flags: next, Next: d0})
		return []uint16{d0}
	}},
	{name: "two-descriptor loop", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.buf, Len: 12, Flags: next, Next: d0 + 1})
		e.r.SetDesc(d0+1, fe.Desc{Addr: e.buf + 12, Len: 42, Flags: next, Next: d0})
		return []uint16{d0}
	}},
	{name: "next index beyond the ring", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.buf, Len: 12, Flags: next, Next: 300})
		return []uint16{d0}
	}},
	{name: "address outside memory", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: 0x7fff_0000_0000, Len: 54})
		return []uint16{d0}
	}},
	{name: "address in the pc hole", opts: fe.Options{Layout: fe.LayoutPCHole}, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: 0xb0000, Len: 54})
		return []uint16{d0}
	}},
	{name: "length 0xffffffff", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.buf, Len: 0xffffffff})
		return []uint16{d0}
	}},
	{name: "address plus length overflows", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: 0xffff_ffff_ffff_ff00, Len: 0x200})
		return []uint16{d0}
	}},
	{name: "buffer crosses the end of memory", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.end - 16, Len: 64})
		return []uint16{d0}
	}},
	{name: "second descriptor outside memory", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.buf, Len: 12, Flags: next, Next: d0 + 1})
		e.r.SetDesc(d0+1, fe.Desc{Addr: 1 << 50, Len: 42})
		return []uint16{d0}
	}},
	{name: "device-writable before readable on TX", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.buf, Len: 12, Flags: next | write, Next: d0 + 1})
		e.r.SetDesc(d0+1, fe.Desc{Addr: e.buf + 12, Len: 42})
		return []uint16{d0}
	}},
	{name: "zero-length descriptor", tolerated: true, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.buf, Len: 0})
		return []uint16{d0}
	}},
	{name: "chain shorter than the virtio header", tolerated: true, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.buf, Len: 5})
		return []uint16{d0}
	}},
	{name: "nested indirect", build: func(t *testing.T, e *descEnv) []uint16 {
		inner := e.table(t, []fe.Desc{{Addr: e.buf, Len: 54}})
		outer := e.table(t, []fe.Desc{{Addr: inner, Len: 16, Flags: indirect}})
		e.r.SetDesc(d0, fe.Desc{Addr: outer, Len: 16, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "indirect table of 24 bytes", build: func(t *testing.T, e *descEnv) []uint16 {
		tb := e.table(t, []fe.Desc{{Addr: e.buf, Len: 54}, {}})
		e.r.SetDesc(d0, fe.Desc{Addr: tb, Len: 24, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "indirect table of 0 bytes", build: func(t *testing.T, e *descEnv) []uint16 {
		tb := e.table(t, []fe.Desc{{Addr: e.buf, Len: 54}})
		e.r.SetDesc(d0, fe.Desc{Addr: tb, Len: 0, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "indirect table of 0xfffffff0 bytes", build: func(t *testing.T, e *descEnv) []uint16 {
		tb := e.table(t, []fe.Desc{{Addr: e.buf, Len: 54}})
		e.r.SetDesc(d0, fe.Desc{Addr: tb, Len: 0xfffffff0, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "indirect table of 1024 entries", build: func(t *testing.T, e *descEnv) []uint16 {
		descs := make([]fe.Desc, 1024)
		for i := range descs {
			descs[i] = fe.Desc{Addr: e.buf + uint64(i%64), Len: 1, Flags: next, Next: uint16(i + 1)}
		}
		descs[1023].Flags = 0
		tb := e.table(t, descs)
		e.r.SetDesc(d0, fe.Desc{Addr: tb, Len: 16 * 1024, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "loop inside an indirect table", build: func(t *testing.T, e *descEnv) []uint16 {
		tb := e.table(t, []fe.Desc{{Addr: e.buf, Len: 12, Flags: next, Next: 1}, {Addr: e.buf + 12, Len: 42, Flags: next, Next: 0}})
		e.r.SetDesc(d0, fe.Desc{Addr: tb, Len: 32, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "indirect next beyond the table", build: func(t *testing.T, e *descEnv) []uint16 {
		tb := e.table(t, []fe.Desc{{Addr: e.buf, Len: 12, Flags: next, Next: 5}, {Addr: e.buf + 12, Len: 42}})
		e.r.SetDesc(d0, fe.Desc{Addr: tb, Len: 32, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "indirect table outside memory", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: 1 << 50, Len: 32, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "indirect table crossing the end of memory", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.end - 16, Len: 64, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "indirect entry outside memory", build: func(t *testing.T, e *descEnv) []uint16 {
		tb := e.table(t, []fe.Desc{{Addr: e.buf, Len: 12, Flags: next, Next: 1}, {Addr: 1 << 50, Len: 42}})
		e.r.SetDesc(d0, fe.Desc{Addr: tb, Len: 32, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "indirect with next flag", tolerated: true, build: func(t *testing.T, e *descEnv) []uint16 {
		tb := e.table(t, []fe.Desc{{Addr: e.buf, Len: 54}})
		e.r.SetDesc(d0, fe.Desc{Addr: tb, Len: 16, Flags: indirect | next, Next: d0})
		return []uint16{d0}
	}},
	{name: "indirect after a direct descriptor", tolerated: true, build: func(t *testing.T, e *descEnv) []uint16 {
		tb := e.table(t, []fe.Desc{{Addr: e.buf + 12, Len: 42}})
		e.r.SetDesc(d0, fe.Desc{Addr: e.buf, Len: 12, Flags: next, Next: d0 + 1})
		e.r.SetDesc(d0+1, fe.Desc{Addr: tb, Len: 16, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "indirect not negotiated", opts: fe.Options{FeatureMask: fe.DefaultFeatureMask &^ fe.Bit(fe.FeatIndirectDesc)}, build: func(t *testing.T, e *descEnv) []uint16 {
		tb := e.table(t, []fe.Desc{{Addr: e.buf, Len: 54}})
		e.r.SetDesc(d0, fe.Desc{Addr: tb, Len: 16, Flags: indirect})
		return []uint16{d0}
	}},
	{name: "same bad head made available 8 times", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.buf, Len: 64, Flags: next, Next: d0})
		return []uint16{d0, d0, d0, d0, d0, d0, d0, d0}
	}},
	{name: "bad chains between good ones", build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(d0, fe.Desc{Addr: e.buf, Len: 54})
		e.r.SetDesc(d0+1, fe.Desc{Addr: 1 << 50, Len: 54})
		e.r.SetDesc(d0+2, fe.Desc{Addr: e.buf, Len: 54})
		return []uint16{d0, d0 + 1, d0 + 2}
	}, tolerated: true},
	{name: "avail index 257 ahead", broken: true, raw: true, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetAvailIdx(e.r.AvailIdx() + e.r.Size() + 1)
		e.r.Kick()
		return nil
	}},
	{name: "avail index running backwards", broken: true, raw: true, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetAvailIdx(e.r.AvailIdx() - 3)
		e.r.Kick()
		return nil
	}},
	{name: "avail entry head 1000", broken: true, build: func(t *testing.T, e *descEnv) []uint16 {
		return []uint16{1000}
	}},
	{name: "avail index ahead on a 16-entry ring", broken: true, raw: true, opts: fe.Options{RingSize: 16}, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetAvailIdx(e.r.AvailIdx() + 17)
		e.r.Kick()
		return nil
	}},

	// RX ring: the device writes into these.
	{name: "rx buffer outside memory", rx: true, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(200, fe.Desc{Addr: 1 << 50, Len: 2048, Flags: write})
		return []uint16{200}
	}},
	{name: "rx buffer length 0xffffffff", rx: true, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(200, fe.Desc{Addr: e.buf, Len: 0xffffffff, Flags: write})
		return []uint16{200}
	}},
	{name: "rx loop", rx: true, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(200, fe.Desc{Addr: e.buf, Len: 1024, Flags: write | next, Next: 201})
		e.r.SetDesc(201, fe.Desc{Addr: e.buf + 1024, Len: 1024, Flags: write | next, Next: 200})
		return []uint16{200}
	}},
	{name: "rx buffer device-readable only", rx: true, tolerated: true, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(200, fe.Desc{Addr: e.buf, Len: 2048})
		return []uint16{200}
	}},
	{name: "rx buffer of 4 bytes", rx: true, tolerated: true, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetDesc(200, fe.Desc{Addr: e.buf, Len: 4, Flags: write})
		return []uint16{200}
	}},
	{name: "rx nested indirect", rx: true, build: func(t *testing.T, e *descEnv) []uint16 {
		inner := e.table(t, []fe.Desc{{Addr: e.buf, Len: 2048, Flags: write}})
		outer := e.table(t, []fe.Desc{{Addr: inner, Len: 16, Flags: indirect}})
		e.r.SetDesc(200, fe.Desc{Addr: outer, Len: 16, Flags: indirect})
		return []uint16{200}
	}},
	{name: "rx avail index ahead", rx: true, broken: true, raw: true, build: func(t *testing.T, e *descEnv) []uint16 {
		e.r.SetAvailIdx(e.r.AvailIdx() + e.r.Size() + 1)
		e.r.Kick()
		return nil
	}},
}

func TestHostileDescriptors(t *testing.T) {
	for _, c := range descCases {
		t.Run(c.name, func(t *testing.T) {
			isolate(t, func(t *testing.T) { runDescCase(t, c) })
		})
	}
}

func runDescCase(t *testing.T, c descCase) {
	s := startServer(t)
	s.healthy(t)
	baseFDs := fdCount(t)
	f := s.connect(t, c.opts)
	p := f.Pair0()
	ringIdx := 1
	r := p.TX
	if c.rx {
		ringIdx, r = 0, p.RX
	} else {
		// The pair works before the attack.
		exchange(t, f)
	}
	e := &descEnv{f: f, r: r}
	var err error
	if e.buf, err = f.Mem.Alloc(4096, 64); err != nil {
		t.Fatal(err)
	}
	frame := append(make([]byte, 12), arpRequest()...)
	f.Mem.Write(e.buf, frame)
	regs := f.Mem.Regions()
	e.end = regs[len(regs)-1].GuestAddr + regs[len(regs)-1].Size

	st := &s.stats.Rings[ringIdx]
	badBefore := st.BadChains.Load()
	brokenBefore := s.plane.broken.Load()
	usedBefore := r.UsedIdx()
	heads := c.build(t, e)
	if !c.raw {
		for i, h := range heads {
			r.SetAvailEntry(r.AvailIdx()+uint16(i), h)
		}
		r.SetAvailIdx(r.AvailIdx() + uint16(len(heads)))
		r.Kick()
	}
	if c.rx {
		// Good buffers behind the bad ones, then a frame for the guest:
		// only that makes the device take RX buffers.
		if err := p.PostRX(8, 2048); err != nil {
			t.Fatal(err)
		}
		if err := p.SubmitTX(arpRequest()); err != nil {
			t.Fatal(err)
		}
	}

	if c.broken {
		deadline := time.Now().Add(2 * time.Second)
		for s.plane.broken.Load() == brokenBefore {
			if time.Now().After(deadline) {
				t.Fatalf("queue not reported broken (used idx %d → %d)", usedBefore, r.UsedIdx())
			}
			time.Sleep(time.Millisecond)
		}
		if c.rx {
			// TX still works: the request is returned.
			if err := p.WaitTX(2 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		if err := r.WaitUsedIdx(usedBefore+uint16(len(heads)), 2*time.Second); err != nil {
			t.Fatalf("bad chains not returned used: used idx %d → %d, want +%d", usedBefore, r.UsedIdx(), len(heads))
		}
		for i, h := range heads {
			u := r.UsedElem(usedBefore + uint16(i))
			if u.ID != uint32(h) {
				t.Errorf("used[%d] id %d, want head %d", i, u.ID, h)
			}
			if !c.tolerated && u.Len != 0 {
				t.Errorf("used[%d] len %d for a malformed chain, want 0", i, u.Len)
			}
		}
		if got := st.BadChains.Load() - badBefore; !c.tolerated && got != uint64(len(heads)) {
			t.Errorf("BadChains moved by %d, want %d", got, len(heads))
		}
		r.SkipUsed(uint16(len(heads)))
		// The same queue goes on working after rejecting the chains.
		if c.rx {
			frames, err := p.ReceiveRX(3 * time.Second)
			if err != nil {
				t.Fatalf("no ARP reply after the bad RX chain: %v", err)
			}
			checkARPReply(t, frames[0].Data)
		} else {
			exchange(t, f)
		}
	}
	if s.plane.broken.Load() != brokenBefore && !c.broken {
		t.Errorf("queue broken by a chain that should only be rejected")
	}
	f.Close()
	s.healthy(t)
	waitFDs(t, baseFDs)
}

package virtqueue_test

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"vunet/virtqueue"
)

// Fuzz memory: region A [0,0x4000) holds the rings and, from fuzzDataGPA,
// the fuzzer's extra bytes (indirect tables, buffers); region B
// [0x4000,0x5000) is adjacent to A (spanning buffers); region C
// [0x10000,0x11000) sits behind a hole.
const (
	fuzzDescGPA  = 0x0
	fuzzAvailGPA = 0x1000
	fuzzUsedGPA  = 0x1800
	fuzzDataGPA  = 0x2000
	fuzzUserOff  = 0x1_0000_0000
)

type fuzzMem struct {
	mem  *virtqueue.Memory
	regs []*virtqueue.Region
	a    []byte
}

func newFuzzMem(t testing.TB) *fuzzMem {
	fm := &fuzzMem{}
	for _, s := range []virtqueue.RegionSpec{
		{GuestAddr: 0, Size: 0x4000, UserAddr: fuzzUserOff},
		{GuestAddr: 0x4000, Size: 0x1000, UserAddr: fuzzUserOff + 0x4000},
		{GuestAddr: 0x10000, Size: 0x1000, UserAddr: fuzzUserOff + 0x10000},
	} {
		r, err := virtqueue.NewRegion(s, make([]byte, s.Size))
		if err != nil {
			t.Fatal(err)
		}
		fm.regs = append(fm.regs, r)
	}
	fm.a = fm.regs[0].Bytes()
	var err error
	if fm.mem, err = virtqueue.NewMemory(fm.regs); err != nil {
		t.Fatal(err)
	}
	return fm
}

// inMemory reports whether b lies wholly inside one region's bytes.
func (fm *fuzzMem) inMemory(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	for _, r := range fm.regs {
		rb := r.Bytes()
		base := uintptr(unsafe.Pointer(unsafe.SliceData(rb)))
		if p >= base && p-base <= uintptr(len(rb)) && uintptr(len(b)) <= uintptr(len(rb))-(p-base) {
			return true
		}
	}
	return false
}

// fuzzDescs encodes descriptors {addr, len, flags, next}.
func fuzzDescs(ds ...[4]uint64) []byte {
	var b []byte
	for _, d := range ds {
		b = binary.LittleEndian.AppendUint64(b, d[0])
		b = binary.LittleEndian.AppendUint32(b, uint32(d[1]))
		b = binary.LittleEndian.AppendUint16(b, uint16(d[2]))
		b = binary.LittleEndian.AppendUint16(b, uint16(d[3]))
	}
	return b
}

func fuzzAvail(heads ...uint16) []byte {
	var b []byte
	for _, h := range heads {
		b = binary.LittleEndian.AppendUint16(b, h)
	}
	return b
}

const (
	fuzzIndirect = 1 << iota
	fuzzEventIdx
	fuzzUnpop
)

func FuzzPop(f *testing.F) {
	const N, W, I = virtqueue.DescFlagNext, virtqueue.DescFlagWrite, virtqueue.DescFlagIndirect
	d := uint64(fuzzDataGPA)
	// Good chains: direct single, header+frame+rx, indirect, spanning A|B.
	f.Add(uint8(3), uint8(fuzzIndirect|fuzzUnpop), uint16(4), uint16(0),
		fuzzDescs([4]uint64{d, 64, 0, 0}, [4]uint64{d, 12, N, 2}, [4]uint64{d + 12, 100, N, 3}, [4]uint64{d + 200, 1500, W, 0},
			[4]uint64{d + 0x40, 48, I, 0}, [4]uint64{0x3ff0, 0x20, 0, 0}),
		fuzzAvail(0, 1, 4, 5),
		append(make([]byte, 0x40), fuzzDescs([4]uint64{d, 12, N, 2}, [4]uint64{d + 100, 64, W, 0}, [4]uint64{d + 12, 50, N, 1})...))
	// Loops, out of range, nested indirect, wrap-around indices.
	f.Add(uint8(2), uint8(fuzzIndirect|fuzzEventIdx), uint16(2), uint16(0xfffe),
		fuzzDescs([4]uint64{d, 1, N, 1}, [4]uint64{d, 1, N, 0}, [4]uint64{d, 16, I, 0}, [4]uint64{0xffff_ffff_ffff_fff0, 0x100, 0, 0}),
		fuzzAvail(0, 2, 3, 9), fuzzDescs([4]uint64{d, 16, I, 0}))
	// avail.idx far ahead.
	f.Add(uint8(1), uint8(0), uint16(100), uint16(0), fuzzDescs([4]uint64{d, 0xffffffff, 0, 0}), fuzzAvail(0, 1), []byte{})
	// Indirect without negotiation, write-then-read, buffer behind the hole.
	f.Add(uint8(2), uint8(fuzzUnpop), uint16(3), uint16(7),
		fuzzDescs([4]uint64{d, 16, I, 0}, [4]uint64{d, 8, W | N, 2}, [4]uint64{d, 8, 0, 0}, [4]uint64{0x10800, 0x800, W, 0}),
		fuzzAvail(0, 1, 3, 3), []byte{})
	// One memory for all runs (a worker runs them one at a time), cleared
	// each time: cheap executions keep input minimization fast.
	fm := newFuzzMem(f)
	f.Fuzz(func(t *testing.T, sizeLog, flags uint8, availIdx, lastAvail uint16, descs, avail, extra []byte) {
		for _, r := range fm.regs {
			clear(r.Bytes())
		}
		size := uint16(1) << (sizeLog % 7) // 1..64: the desc table fits below fuzzAvailGPA
		copy(fm.a[fuzzDescGPA:fuzzDescGPA+16*int(size)], descs)
		copy(fm.a[fuzzAvailGPA+4:fuzzAvailGPA+4+2*int(size)], avail)
		copy(fm.a[fuzzDataGPA:], extra)
		if len(extra) > len(fm.a)-fuzzDataGPA {
			copy(fm.regs[1].Bytes(), extra[len(fm.a)-fuzzDataGPA:])
		}
		binary.LittleEndian.PutUint16(fm.a[fuzzAvailGPA+2:], availIdx)
		binary.LittleEndian.PutUint16(fm.a[fuzzUsedGPA+2:], lastAvail)
		st := new(virtqueue.Stats)
		q, err := virtqueue.NewSplitQueue(virtqueue.Config{
			Size: size, LastAvail: lastAvail,
			Addr:     virtqueue.Addresses{Desc: fuzzUserOff + fuzzDescGPA, Avail: fuzzUserOff + fuzzAvailGPA, Used: fuzzUserOff + fuzzUsedGPA},
			Indirect: flags&fuzzIndirect != 0, EventIdx: flags&fuzzEventIdx != 0,
			Kick: -1, Call: -1, Mem: fm.mem, Stats: st, Logger: quiet,
		})
		if err != nil {
			t.Fatal(err)
		}
		pending := availIdx - lastAvail
		var c virtqueue.Chain
		var heads []uint16
		check := func() {
			if len(c.Readable)+len(c.Writable) > virtqueue.MaxChainSegments {
				t.Fatalf("%d segments", len(c.Readable)+len(c.Writable))
			}
			if c.Descriptors() > int(size)+virtqueue.MaxIndirectDescs {
				t.Fatalf("%d descriptors in a ring of %d", c.Descriptors(), size)
			}
			if c.ReadableLen()+c.WritableLen() > virtqueue.MaxChainBytes || c.Head >= size {
				t.Fatalf("chain head %d, %d bytes", c.Head, c.ReadableLen()+c.WritableLen())
			}
			for _, b := range append(append([][]byte(nil), c.Readable...), c.Writable...) {
				if !fm.inMemory(b) {
					t.Fatalf("iovec outside guest memory (%d bytes)", len(b))
				}
			}
		}
		broken := false
		for i := 0; ; i++ {
			if i > int(size) {
				t.Fatalf("more than %d chains from a ring of %d", i, size)
			}
			ok, err := q.Pop(&c)
			if err != nil {
				broken = true
				break
			}
			if !ok {
				break
			}
			check()
			heads = append(heads, c.Head)
		}
		if pending > size && !broken {
			t.Fatalf("avail.idx %d ahead by %d not refused", availIdx, pending)
		}
		if !broken && st.Chains.Load()+st.BadChains.Load() != uint64(pending) {
			t.Fatalf("%d chains + %d bad for %d pending", st.Chains.Load(), st.BadChains.Load(), pending)
		}
		if flags&fuzzUnpop != 0 && len(heads) > 0 && !broken {
			k := int(extraByte(extra) % 4)
			before := q.LastAvail()
			bad := st.BadChains.Load()
			q.Unpop(k)
			if uint16(before-q.LastAvail()) > size {
				t.Fatalf("Unpop(%d) rewound %d entries of a ring of %d", k, before-q.LastAvail(), size)
			}
			// Re-Pop returns the last m chains again (bad ones are skipped,
			// not pushed twice) and stops where the first pass stopped.
			var again []uint16
			for i := 0; ; i++ {
				ok, err := q.Pop(&c)
				if err != nil || i > k {
					t.Fatalf("re-pop %d after Unpop(%d): %v", i, k, err)
				}
				if !ok {
					break
				}
				check()
				again = append(again, c.Head)
			}
			if q.LastAvail() != before {
				t.Fatalf("LastAvail %d after re-pop, want %d", q.LastAvail(), before)
			}
			if len(again) > k || len(again) > len(heads) {
				t.Fatalf("Unpop(%d) gave back %d chains", k, len(again))
			}
			for j, h := range again {
				if want := heads[len(heads)-len(again)+j]; h != want {
					t.Fatalf("re-popped head %d, want %d", h, want)
				}
			}
			if st.BadChains.Load() != bad {
				t.Fatalf("re-pop: BadChains %d -> %d", bad, st.BadChains.Load())
			}
		}
		for _, h := range heads {
			q.Push(h, 0)
		}
		q.Flush()
		if !broken {
			used := binary.LittleEndian.Uint16(fm.a[fuzzUsedGPA+2:])
			if used != lastAvail+pending {
				t.Fatalf("used.idx %d, want %d", used, lastAvail+pending)
			}
		}
	})
}

func extraByte(b []byte) byte {
	if len(b) == 0 {
		return 1
	}
	return b[0]
}

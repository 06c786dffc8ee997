package virtqueue_test

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

const page = virtqueue.DirtyLogPageSize

// logBytes returns an 8-aligned byte slice of n bytes (n a multiple of 8).
func logBytes(n int) []byte {
	w := make([]uint64, n/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), n)
}

// refMark is the spec's pseudo-code, byte by byte: "page = addr /
// VHOST_LOG_PAGE; log[page / 8] |= 1 << page % 8" for every page the range
// touches, pages beyond the log ignored.
func refMark(log []byte, gpa, n uint64) {
	if n == 0 {
		return
	}
	last := gpa + n - 1
	if last < gpa {
		last = math.MaxUint64
	}
	for p := gpa / page; p <= last/page && p/8 < uint64(len(log)); p++ {
		log[p/8] |= 1 << (p % 8)
		if p == math.MaxUint64/page {
			break
		}
	}
}

// dirtyPages lists the pages set in a log.
func dirtyPages(b []byte) []uint64 {
	var out []uint64
	for i, v := range b {
		for bit := 0; bit < 8; bit++ {
			if v&(1<<bit) != 0 {
				out = append(out, uint64(i)*8+uint64(bit))
			}
		}
	}
	return out
}

func TestDirtyLogMarkMatchesSpec(t *testing.T) {
	cases := []struct {
		name   string
		gpa, n uint64
		ok     bool
	}{
		{"one byte", 0x1234, 1, true},
		{"whole page", 0x5000, page, true},
		{"across a page", 0x5fff, 2, true},
		{"across a word", 63 * page, 2 * page, true},
		{"many words", 10 * page, 200 * page, true},
		{"last page", 511 * page, page, true},
		{"past the end", 510 * page, 4 * page, false},
		{"wholly outside", 4096 * page, 1, false},
		{"wraps", math.MaxUint64 - 10, 100, false},
		{"empty", 0x1000, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := logBytes(64) // 512 pages
			l, err := virtqueue.NewDirtyLog(b)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]byte, len(b))
			refMark(want, c.gpa, c.n)
			if ok := l.Mark(c.gpa, c.n); ok != c.ok {
				t.Errorf("Mark(%#x, %#x) = %v, want %v", c.gpa, c.n, ok, c.ok)
			}
			if !slices.Equal(b, want) {
				t.Errorf("dirty pages %v, want %v", dirtyPages(b), dirtyPages(want))
			}
		})
	}
}

func TestDirtyLogMarkRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	b := logBytes(256)
	want := make([]byte, len(b))
	l, err := virtqueue.NewDirtyLog(b)
	if err != nil {
		t.Fatal(err)
	}
	for range 2000 {
		gpa := rng.Uint64N(2200 * page)
		n := rng.Uint64N(70 * page)
		refMark(want, gpa, n)
		l.Mark(gpa, n)
	}
	if !slices.Equal(b, want) {
		t.Fatalf("log differs from the spec's marking: got %d pages, want %d", len(dirtyPages(b)), len(dirtyPages(want)))
	}
}

// TestDirtyLogConcurrentReader marks pages while a front-end-like reader
// takes the log word by word with atomic exchanges (what QEMU's
// vhost_dev_sync_region does): every page marked must reach the reader
// exactly as if it had read once at the end. A plain store instead of an
// atomic OR loses bits here.
func TestDirtyLogConcurrentReader(t *testing.T) {
	b := logBytes(64)
	l, err := virtqueue.NewDirtyLog(b)
	if err != nil {
		t.Fatal(err)
	}
	words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	var got [8]uint64
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			for i := range words {
				got[i] |= atomic.SwapUint64(&words[i], 0)
			}
		}
	}()
	want := make([]byte, len(b))
	var markers sync.WaitGroup
	for m := range 2 {
		markers.Add(1)
		go func() {
			defer markers.Done()
			for i := range 20000 {
				p := uint64((i*7 + m*3) % 512)
				l.Mark(p*page+100, 1)
			}
		}()
	}
	markers.Wait()
	stop.Store(true)
	wg.Wait()
	for i := range words {
		got[i] |= words[i]
	}
	for m := range 2 {
		for i := range 20000 {
			p := uint64((i*7 + m*3) % 512)
			refMark(want, p*page+100, 1)
		}
	}
	gotBytes := unsafe.Slice((*byte)(unsafe.Pointer(&got[0])), 64)
	if !slices.Equal(gotBytes, want) {
		t.Fatalf("reader saw %d pages, want %d", len(dirtyPages(gotBytes)), len(dirtyPages(want)))
	}
}

// memfdOf returns a memfd of size bytes.
func memfdOf(t *testing.T, size int64) int {
	t.Helper()
	fd, err := unix.MemfdCreate("vunet-dirty-log", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestMapDirtyLog maps a log as the front-end hands it over and checks a
// mark reaches the front-end's file at the right byte, also through an
// offset that is not page-aligned.
func TestMapDirtyLog(t *testing.T) {
	for _, off := range []uint64{0, 8, 4096 + 24} {
		fd := memfdOf(t, 3*4096)
		l, err := virtqueue.MapDirtyLog(fd, 4096, off)
		if err != nil {
			t.Fatalf("offset %d: %v", off, err)
		}
		if l.Size() != 4096 {
			t.Errorf("Size %d", l.Size())
		}
		l.Mark(19*page, 1) // byte 2, bit 3
		var b [1]byte
		if _, err := unix.Pread(fd, b[:], int64(off)+2); err != nil {
			t.Fatal(err)
		}
		if b[0] != 1<<3 {
			t.Errorf("offset %d: log byte 2 in the file is %#x, want 0x08", off, b[0])
		}
		if !l.Dirty(19*page) || l.Dirty(18*page) {
			t.Error("Dirty disagrees with the mark")
		}
		if err := l.Unmap(); err != nil {
			t.Fatal(err)
		}
		if err := l.Unmap(); err != nil {
			t.Fatalf("second Unmap: %v", err)
		}
	}
}

// TestMapDirtyLogHostile refuses every log a front-end could use to make us
// fault or misbehave, with the reason.
func TestMapDirtyLogHostile(t *testing.T) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	cases := []struct {
		name         string
		fd           int
		size, offset uint64
		want         error
	}{
		{"zero size", memfdOf(t, 4096), 0, 0, virtqueue.ErrDirtyLogSize},
		{"odd size", memfdOf(t, 4096), 12, 0, virtqueue.ErrDirtyLogSize},
		{"huge size", memfdOf(t, 4096), virtqueue.MaxDirtyLogSize + 8, 0, virtqueue.ErrDirtyLogSize},
		{"unaligned offset", memfdOf(t, 8192), 4096, 4, virtqueue.ErrDirtyLogOffset},
		{"offset overflows", memfdOf(t, 4096), 4096, math.MaxUint64 - 7, virtqueue.ErrDirtyLogOffset},
		{"beyond the file", memfdOf(t, 4096), 8192, 0, virtqueue.ErrDirtyLogSize},
		{"offset beyond the file", memfdOf(t, 4096), 8, 8192, virtqueue.ErrDirtyLogSize},
		{"empty file", memfdOf(t, 0), 4096, 0, virtqueue.ErrDirtyLogSize},
		{"eventfd", efd, 4096, 0, virtqueue.ErrDirtyLogFile},
		{"pipe", pipe[0], 4096, 0, virtqueue.ErrDirtyLogFile},
		{"closed fd", 1 << 20, 4096, 0, virtqueue.ErrDirtyLogFile},
	}
	for _, c := range cases {
		l, err := virtqueue.MapDirtyLog(c.fd, c.size, c.offset)
		if err == nil {
			l.Unmap()
			t.Errorf("%s: mapped", c.name)
			continue
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := virtqueue.NewDirtyLog(logBytes(64)[1:9]); err == nil {
		t.Error("NewDirtyLog took unaligned memory")
	}
}

// FuzzMapDirtyLog: whatever size and offset a front-end sends for a file of
// any size, MapDirtyLog maps exactly the valid ones, and marking anywhere in
// a mapped log never faults.
func FuzzMapDirtyLog(f *testing.F) {
	f.Add(uint64(4096), uint64(0), uint32(4096), uint64(0x123456), uint64(1))
	f.Add(uint64(16), uint64(8), uint32(24), uint64(127*page), uint64(2*page))
	f.Add(uint64(8), uint64(4096), uint32(4096), uint64(0), uint64(math.MaxUint64))
	f.Fuzz(func(t *testing.T, size, offset uint64, fileSize uint32, gpa, n uint64) {
		fileSize %= 1 << 20
		fd := memfdOf(t, int64(fileSize))
		l, err := virtqueue.MapDirtyLog(fd, size, offset)
		valid := size > 0 && size%8 == 0 && size <= virtqueue.MaxDirtyLogSize && offset%8 == 0 &&
			offset <= uint64(fileSize) && size <= uint64(fileSize)-offset
		if (err == nil) != valid {
			t.Fatalf("size %#x offset %#x file %#x: err %v, valid %v", size, offset, fileSize, err, valid)
		}
		if err != nil {
			return
		}
		defer l.Unmap()
		l.Mark(gpa, n)
		l.Mark(gpa%(8*size*page), n%(1<<24))
	})
}

// logRig is a rig whose queue logs into a fresh 64-byte log (512 pages,
// the rig's whole 1 MiB of guest memory and more).
type logRig struct {
	*rig
	log *virtqueue.DirtyLog
	buf []byte
}

func newLogRig(t testing.TB, o rigOpt, lc virtqueue.LogConfig) *logRig {
	t.Helper()
	r := newRig(t, o)
	lr := &logRig{rig: r, buf: logBytes(64)}
	var err error
	if lr.log, err = virtqueue.NewDirtyLog(lr.buf); err != nil {
		t.Fatal(err)
	}
	lc.Log = lr.log
	cfg := r.cfg
	cfg.Log = &lc
	if r.q, err = virtqueue.NewSplitQueue(cfg); err != nil {
		t.Fatal(err)
	}
	// Building the queue marked the used ring (avail_event, flags).
	clear(lr.buf)
	r.stats.DirtyLogWrites.Store(0)
	return lr
}

// rxChain offers a chain whose writable buffers lie at chosen addresses,
// pops it, and returns its head.
func (r *logRig) rxChain(t *testing.T, bufs ...vqtest.Buf) uint16 {
	t.Helper()
	if _, err := r.d.AddChain(bufs...); err != nil {
		t.Fatal(err)
	}
	r.d.Publish(false)
	var c virtqueue.Chain
	if !r.pop(t, &c) {
		t.Fatal("no chain")
	}
	return c.Head
}

func pagesOf(gpas ...uint64) []uint64 {
	var out []uint64
	for _, g := range gpas {
		out = append(out, g/page)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestQueueLogsWrittenBuffers: returning an RX chain marks exactly the
// pages of its writable buffers that the written length covers (not the
// readable one, not the unwritten tail), and publishing marks the used ring
// at its log address.
func TestQueueLogsWrittenBuffers(t *testing.T) {
	for _, eventIdx := range []bool{false, true} {
		r := newLogRig(t, rigOpt{size: 8, eventIdx: eventIdx}, virtqueue.LogConfig{LogUsed: true, UsedGPA: 0xf0000})
		head := r.rxChain(t,
			vqtest.Buf{GPA: 0x18000, Len: 64},                          // readable: never marked
			vqtest.Buf{GPA: 0x20f00, Len: 0x200, Write: true},          // pages 0x20, 0x21
			vqtest.Buf{GPA: 0x30000, Len: 0x100, Write: true},          // page 0x30, partly written
			vqtest.Buf{GPA: 0x40000, Len: 0x100, Write: true},          // not written
			vqtest.Buf{GPA: 0x50000 - 0x10, Len: 0x20000, Write: true}, // not written
		)
		r.q.Push(head, 0x200+0x80)
		if got, want := dirtyPages(r.buf), pagesOf(0x20f00, 0x21000, 0x30000); !slices.Equal(got, want) {
			t.Errorf("event_idx %v: after Push, dirty pages %#x, want %#x", eventIdx, got, want)
		}
		r.q.Flush()
		if got, want := dirtyPages(r.buf), pagesOf(0x20f00, 0x21000, 0x30000, 0xf0000); !slices.Equal(got, want) {
			t.Errorf("event_idx %v: after Flush, dirty pages %#x, want %#x (used ring logged at 0xf0000)", eventIdx, got, want)
		}
		if w, m := r.stats.DirtyLogWrites.Load(), r.stats.DirtyLogMisses.Load(); w != 3 || m != 0 {
			t.Errorf("event_idx %v: %d log writes, %d misses; want 3, 0", eventIdx, w, m)
		}
	}
}

// TestQueueLogsIndirectChain follows an indirect table, as Pop does.
func TestQueueLogsIndirectChain(t *testing.T) {
	r := newLogRig(t, rigOpt{size: 8, indirect: true}, virtqueue.LogConfig{})
	table := r.g.Bytes(0x50000, 32)
	vqtest.PutDesc(table, 0, 0x60000, 0x1000, virtqueue.DescFlagWrite|virtqueue.DescFlagNext, 1)
	vqtest.PutDesc(table, 1, 0x70000, 0x10, virtqueue.DescFlagWrite, 0)
	r.d.SetDesc(0, 0x50000, 32, virtqueue.DescFlagIndirect, 0)
	r.d.PutAvail(0)
	r.d.Publish(false)
	var c virtqueue.Chain
	if !r.pop(t, &c) || c.WritableLen() != 0x1010 {
		t.Fatalf("indirect chain not popped whole: %d writable bytes", c.WritableLen())
	}
	r.q.Push(c.Head, 0x1008)
	r.q.Flush()
	// LogUsed off: the used ring is not logged.
	if got, want := dirtyPages(r.buf), pagesOf(0x60000, 0x70000); !slices.Equal(got, want) {
		t.Errorf("dirty pages %#x, want %#x", got, want)
	}
}

// TestQueueLogsUsedRingStores: the stores to used.flags and avail_event a
// queue makes without publishing (kick suppression) are logged too.
func TestQueueLogsUsedRingStores(t *testing.T) {
	for _, eventIdx := range []bool{false, true} {
		r := newLogRig(t, rigOpt{size: 8, eventIdx: eventIdx}, virtqueue.LogConfig{LogUsed: true, UsedGPA: 0x3000})
		r.q.DisableKicks()
		r.q.EnableKicks()
		var c virtqueue.Chain
		r.pop(t, &c) // empty: with EVENT_IDX, moves avail_event
		if got := dirtyPages(r.buf); !slices.Equal(got, []uint64{3}) {
			t.Errorf("event_idx %v: dirty pages %#x, want the used ring's page 3", eventIdx, got)
		}
	}
}

// TestQueueLogOff: without Config.Log nothing is marked, and with a log
// too small for the addresses the misses are counted, nothing faults.
func TestQueueLogOff(t *testing.T) {
	r := newLogRig(t, rigOpt{size: 8}, virtqueue.LogConfig{LogUsed: true, UsedGPA: 0x2000})
	// The same ring without logging.
	cfg := r.cfg
	cfg.Log = nil
	q, err := virtqueue.NewSplitQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if q.Logging() || !r.q.Logging() {
		t.Fatal("Logging() wrong")
	}
	clear(r.buf)
	var c virtqueue.Chain
	r.d.AddChain(vqtest.Buf{GPA: 0x21000, Len: 100, Write: true})
	r.d.Publish(false)
	if ok, _ := q.Pop(&c); !ok {
		t.Fatal("no chain")
	}
	q.Push(c.Head, 100)
	q.Flush()
	if got := dirtyPages(r.buf); len(got) != 0 {
		t.Errorf("a queue without a log marked pages %#x", got)
	}

	// A log of 8 bytes covers 64 pages (256 KiB): a buffer at 1 MiB and a
	// used ring logged beyond are misses, counted, not faults.
	small, err := virtqueue.NewDirtyLog(logBytes(8))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Log = &virtqueue.LogConfig{Log: small, LogUsed: true, UsedGPA: 1 << 40}
	cfg.Stats = new(virtqueue.Stats)
	cfg.LastAvail = 1
	q, err = virtqueue.NewSplitQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.d.AddChain(vqtest.Buf{GPA: 0x90000, Len: 100, Write: true}, vqtest.Buf{GPA: 0x1000, Len: 100, Write: true})
	r.d.Publish(false)
	if ok, _ := q.Pop(&c); !ok {
		t.Fatal("no chain")
	}
	q.Push(c.Head, 200)
	q.Flush()
	if !small.Dirty(0x1000) || small.Dirty(0x90000) {
		t.Error("the covered buffer must be marked, the other cannot be")
	}
	if m := cfg.Stats.DirtyLogMisses.Load(); m < 2 {
		t.Errorf("%d log misses counted, want the buffer's and the used ring's", m)
	}
}

// BenchmarkPopPushLogging is BenchmarkPopPush's RX case (one writable
// descriptor, 1514 bytes written) with logging off and on: off must cost
// nothing measurable next to BenchmarkPopPush; on shows what logging adds.
func BenchmarkPopPushLogging(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			r := newRig(b, rigOpt{size: 256})
			if on {
				l, err := virtqueue.NewDirtyLog(logBytes(64))
				if err != nil {
					b.Fatal(err)
				}
				cfg := r.cfg
				cfg.Log = &virtqueue.LogConfig{Log: l, LogUsed: true, UsedGPA: r.d.UsedGPA}
				if r.q, err = virtqueue.NewSplitQueue(cfg); err != nil {
					b.Fatal(err)
				}
			}
			h, err := r.d.AddChain(vqtest.Buf{GPA: r.d.Alloc(1526), Len: 1526, Write: true})
			if err != nil {
				b.Fatal(err)
			}
			r.d.Publish(false)
			var c virtqueue.Chain
			b.ReportAllocs()
			for b.Loop() {
				ok, err := r.q.Pop(&c)
				if !ok || err != nil {
					b.Fatal(ok, err)
				}
				r.q.Push(c.Head, 1526)
				r.q.Flush()
				r.d.PutAvail(h)
				r.d.Publish(false)
			}
		})
	}
}

// FuzzLogWalk: the driver may rewrite a chain's descriptors between Pop and
// Push (a hostile one does), and Push walks them again to log the written
// buffers. Whatever they become (loops, indirect tables nested, too long,
// outside memory, addresses that wrap) the walk ends, within the ring's and
// the indirect table's bounds, and nothing faults.
func FuzzLogWalk(f *testing.F) {
	const N, W, I = virtqueue.DescFlagNext, virtqueue.DescFlagWrite, virtqueue.DescFlagIndirect
	d := uint64(fuzzDataGPA)
	f.Add(uint8(3), uint8(fuzzIndirect), uint32(3000),
		fuzzDescs([4]uint64{d, 12, W | N, 1}, [4]uint64{d + 0x100, 1500, W, 0}),
		fuzzDescs([4]uint64{d, 16, I, 0}, [4]uint64{d + 0x100, 1500, W | N, 1}),
		fuzzDescs([4]uint64{d + 0x3000, 0x1000, W | N, 1}, [4]uint64{0xffff_ffff_ffff_f000, 0x2000, W | N, 0}))
	f.Add(uint8(2), uint8(0), uint32(0xffffffff),
		fuzzDescs([4]uint64{d, 0x800, W, 0}),
		fuzzDescs([4]uint64{d, 0x800, W | N, 1}, [4]uint64{d, 0x7fffffff, W | N, 0}),
		[]byte{})
	fm := newFuzzMem(f)
	f.Fuzz(func(t *testing.T, sizeLog, flags uint8, written uint32, descs, rewrite, extra []byte) {
		for _, r := range fm.regs {
			clear(r.Bytes())
		}
		size := uint16(1) << (sizeLog % 7)
		copy(fm.a[fuzzDescGPA:fuzzDescGPA+16*int(size)], descs)
		copy(fm.a[fuzzDataGPA:], extra)
		binary.LittleEndian.PutUint16(fm.a[fuzzAvailGPA+2:], 1) // head 0 available
		st := new(virtqueue.Stats)
		l, err := virtqueue.NewDirtyLog(logBytes(8)) // 64 pages: less than the memory
		if err != nil {
			t.Fatal(err)
		}
		q, err := virtqueue.NewSplitQueue(virtqueue.Config{
			Size:     size,
			Addr:     virtqueue.Addresses{Desc: fuzzUserOff + fuzzDescGPA, Avail: fuzzUserOff + fuzzAvailGPA, Used: fuzzUserOff + fuzzUsedGPA},
			Indirect: flags&fuzzIndirect != 0, EventIdx: flags&fuzzEventIdx != 0,
			Kick: -1, Call: -1, Mem: fm.mem, Stats: st, Logger: quiet,
			Log: &virtqueue.LogConfig{Log: l, LogUsed: true, UsedGPA: fuzzUsedGPA},
		})
		if err != nil {
			t.Fatal(err)
		}
		var c virtqueue.Chain
		ok, _ := q.Pop(&c)
		copy(fm.a[fuzzDescGPA:fuzzDescGPA+16*int(size)], rewrite)
		before := st.DirtyLogWrites.Load()
		if ok {
			q.Push(c.Head, written)
		}
		q.Flush()
		if n := st.DirtyLogWrites.Load() - before; n > 1+uint64(size)+virtqueue.MaxIndirectDescs {
			t.Fatalf("%d log writes for one chain of a %d-entry ring", n, size)
		}
	})
}

package tcpstack

import (
	"encoding/binary"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
)

// This file is a minimal guest-side driver over memfd memory for the tests:
// it owns a split ring's three parts and a bump allocator for buffers, and
// builds the device-side virtqueue.SplitQueue over a second mapping of the
// same memfd, as vhostuser would with the front-end's fd.

const (
	testMemSize  = 8 << 20
	testUserBase = 0x7f3400000000 // front-end address of guest-physical 0
)

type testMem struct {
	fd   int
	buf  []byte // driver's mapping
	next uint64 // bump allocator, guest-physical
	vmem *virtqueue.Memory
	reg  *virtqueue.Region
}

func newTestMem(t testing.TB) *testMem {
	t.Helper()
	fd, err := unix.MemfdCreate("tcpstack-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, testMemSize); err != nil {
		t.Fatal(err)
	}
	buf, err := unix.Mmap(fd, 0, testMemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := virtqueue.MapRegion(fd, virtqueue.RegionSpec{GuestAddr: 0, Size: testMemSize, UserAddr: testUserBase})
	if err != nil {
		t.Fatal(err)
	}
	vmem, err := virtqueue.NewMemory([]*virtqueue.Region{reg})
	if err != nil {
		t.Fatal(err)
	}
	m := &testMem{fd: fd, buf: buf, next: 4096, vmem: vmem, reg: reg}
	t.Cleanup(func() {
		reg.Unmap()
		unix.Munmap(buf)
		unix.Close(fd)
	})
	return m
}

func (m *testMem) alloc(t testing.TB, n, align uint64) uint64 {
	a := (m.next + align - 1) &^ (align - 1)
	if a+n > uint64(len(m.buf)) {
		t.Fatalf("test memory exhausted")
	}
	m.next = a + n
	return a
}

// testRing is the driver side of one split ring.
type testRing struct {
	t                 testing.TB
	m                 *testMem
	size              uint16
	desc, avail, used uint64 // guest-physical
	kick, call        int
	eventIdx          bool
	availIdx          uint16
	lastUsed          uint16
	freeDesc          []uint16
	bufOf             map[uint16][]uint64 // head -> buffer addresses (for reading back)
	lenOf             map[uint16][]uint32
	noKick            bool
	errFD             int // vring error eventfd given to the queue; 0: none
	q                 *virtqueue.SplitQueue
	stats             virtqueue.Stats
}

func newTestRing(t testing.TB, m *testMem, index int, size uint16, eventIdx bool) *testRing {
	t.Helper()
	r := &testRing{t: t, m: m, size: size, eventIdx: eventIdx,
		bufOf: map[uint16][]uint64{}, lenOf: map[uint16][]uint32{}}
	r.desc = m.alloc(t, virtqueue.DescTableSize(size), 16)
	r.avail = m.alloc(t, virtqueue.AvailRingSize(size), 2)
	r.used = m.alloc(t, virtqueue.UsedRingSize(size), 4)
	for i := uint16(0); i < size; i++ {
		r.freeDesc = append(r.freeDesc, i)
	}
	var err error
	if r.kick, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if r.call, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(r.kick); unix.Close(r.call) })
	r.rebuild(index, 0)
	return r
}

// rebuild makes a fresh device-side queue continuing at lastAvail, as the
// control plane does on every pair restart.
func (r *testRing) rebuild(index int, lastAvail uint16) {
	kick := r.kick
	if r.noKick {
		kick = -1 // the front-end said "no fd": the device polls
	}
	q, err := virtqueue.NewSplitQueue(virtqueue.Config{
		Index: index, Size: r.size,
		Addr:      virtqueue.Addresses{Desc: testUserBase + r.desc, Avail: testUserBase + r.avail, Used: testUserBase + r.used},
		LastAvail: lastAvail, EventIdx: r.eventIdx, Indirect: true,
		Kick: kick, Call: r.call, Err: r.errFD, Mem: r.m.vmem, Stats: &r.stats, Logger: testLogger(),
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.q = q
}

func (r *testRing) u16(gpa uint64) *uint16 { return (*uint16)(unsafe.Pointer(&r.m.buf[gpa])) }

// addChain adds a chain of buffers (readable ones first) and stages it in the
// avail ring without publishing.
func (r *testRing) addChain(readable [][]byte, writable []uint32) uint16 {
	n := len(readable) + len(writable)
	if n == 0 || n > len(r.freeDesc) {
		r.t.Fatalf("addChain: %d descriptors, %d free", n, len(r.freeDesc))
	}
	ids := r.freeDesc[:n]
	r.freeDesc = r.freeDesc[n:]
	var addrs []uint64
	var lens []uint32
	for i := 0; i < n; i++ {
		var addr uint64
		var l uint32
		var flags uint16
		if i < len(readable) {
			l = uint32(len(readable[i]))
			addr = r.m.alloc(r.t, uint64(l)+1, 8)
			copy(r.m.buf[addr:], readable[i])
		} else {
			l = writable[i-len(readable)]
			addr = r.m.alloc(r.t, uint64(l)+1, 8)
			flags |= virtqueue.DescFlagWrite
		}
		if i+1 < n {
			flags |= virtqueue.DescFlagNext
		}
		d := r.m.buf[r.desc+16*uint64(ids[i]):]
		binary.LittleEndian.PutUint64(d[0:], addr)
		binary.LittleEndian.PutUint32(d[8:], l)
		binary.LittleEndian.PutUint16(d[12:], flags)
		var next uint16
		if i+1 < n {
			next = ids[i+1]
		}
		binary.LittleEndian.PutUint16(d[14:], next)
		addrs = append(addrs, addr)
		lens = append(lens, l)
	}
	head := ids[0]
	r.bufOf[head] = addrs
	r.lenOf[head] = lens
	binary.LittleEndian.PutUint16(r.m.buf[r.avail+4+2*uint64(r.availIdx%r.size):], head)
	r.availIdx++
	return head
}

// publish stores avail.idx (one store for everything added).
func (r *testRing) publish() { atomicStore16(r.u16(r.avail+2), r.availIdx) }

// kickIfNeeded kicks like a Linux driver: honours NO_NOTIFY / avail_event.
func (r *testRing) kickIfNeeded(old uint16) {
	if r.eventIdx {
		ev := atomicLoad16(r.u16(r.used + 4 + 8*uint64(r.size)))
		if !virtqueue.NeedEvent(ev, r.availIdx, old) {
			return
		}
	} else if atomicLoad16(r.u16(r.used))&virtqueue.UsedFlagNoNotify != 0 {
		return
	}
	r.kickNow()
}

func (r *testRing) kickNow() {
	var one = [8]byte{1}
	unix.Write(r.kick, one[:])
}

// send publishes what was added and kicks as a driver would.
func (r *testRing) send() {
	old := atomicLoad16(r.u16(r.avail + 2))
	r.publish()
	r.kickIfNeeded(old)
}

func (r *testRing) usedIdx() uint16 { return atomicLoad16(r.u16(r.used + 2)) }

// popUsed returns the next used element, if any.
func (r *testRing) popUsed() (head uint16, n uint32, ok bool) {
	if r.usedIdx() == r.lastUsed {
		return 0, 0, false
	}
	e := r.m.buf[r.used+4+8*uint64(r.lastUsed%r.size):]
	r.lastUsed++
	head = uint16(binary.LittleEndian.Uint32(e[0:]))
	n = binary.LittleEndian.Uint32(e[4:])
	r.freeDesc = append(r.freeDesc, headChain(r, head)...)
	return head, n, true
}

func headChain(r *testRing, head uint16) []uint16 {
	var ids []uint16
	i := head
	for {
		ids = append(ids, i)
		d := r.m.buf[r.desc+16*uint64(i):]
		if binary.LittleEndian.Uint16(d[12:])&virtqueue.DescFlagNext == 0 {
			return ids
		}
		i = binary.LittleEndian.Uint16(d[14:])
	}
}

// written returns the first n bytes written into chain head's buffers.
func (r *testRing) written(head uint16, n uint32) []byte {
	var out []byte
	for i, a := range r.bufOf[head] {
		l := min(r.lenOf[head][i], n)
		out = append(out, r.m.buf[a:a+uint64(l)]...)
		n -= l
	}
	return out
}

// callCount reads and resets the call eventfd counter.
func (r *testRing) callCount() uint64 {
	var b [8]byte
	n, err := unix.Read(r.call, b[:])
	if err != nil || n != 8 {
		return 0
	}
	return binary.LittleEndian.Uint64(b[:])
}

func atomicLoad16(p *uint16) uint16 {
	// The used index shares a 4-byte word with the flags; a 32-bit atomic
	// load of the aligned word is what the frontend helper does too.
	w := (*uint32)(unsafe.Pointer(uintptr(unsafe.Pointer(p)) &^ 3))
	v := atomic.LoadUint32(w)
	if uintptr(unsafe.Pointer(p))&3 != 0 {
		return uint16(v >> 16)
	}
	return uint16(v)
}

func atomicStore16(p *uint16, v uint16) {
	w := (*uint32)(unsafe.Pointer(uintptr(unsafe.Pointer(p)) &^ 3))
	for {
		old := atomic.LoadUint32(w)
		var nw uint32
		if uintptr(unsafe.Pointer(p))&3 != 0 {
			nw = old&0xffff | uint32(v)<<16
		} else {
			nw = old&^0xffff | uint32(v)
		}
		if atomic.CompareAndSwapUint32(w, old, nw) {
			return
		}
	}
}

func testLogger() *slog.Logger {
	if os.Getenv("TCPSTACK_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testPair is a started (or startable) queue pair with its driver rings.
type testPair struct {
	t         testing.TB
	m         *testMem
	rx, tx    *testRing
	s         *Stack
	qp        virtqueue.QueuePair
	features  uint64
	hdrLen    int
	announced int // frames the loop sends by itself at each start
}

func newTestPair(t testing.TB, features uint64, size uint16) *testPair {
	t.Helper()
	m := newTestMem(t)
	eventIdx := virtqueue.HasFeature(features, virtqueue.FeatureRingEventIdx)
	p := &testPair{t: t, m: m, features: features, hdrLen: virtqueue.NetHdrLenFor(features)}
	p.rx = newTestRing(t, m, 0, size, eventIdx)
	p.tx = newTestRing(t, m, 1, size, eventIdx)
	cfg := Config{Logger: testLogger()}
	cfg.Addr.IPv4.Addr = netip.AddrFrom4(testGuestIP)
	cfg.Addr.IPv4.PrefixLen = 24
	p.s = New(cfg)
	p.qp = virtqueue.QueuePair{Index: 0, RX: p.rx.q, TX: p.tx.q, RXEnabled: true, TXEnabled: true, Features: features}
	t.Cleanup(p.s.Close)
	return p
}

func (p *testPair) start() {
	p.t.Helper()
	p.qp.RX, p.qp.TX = p.rx.q, p.tx.q
	if err := p.s.StartPair(p.qp); err != nil {
		p.t.Fatal(err)
	}
}

// restart stops the pair and starts it on fresh queues continuing where the
// old ones stopped, as the control plane does.
func (p *testPair) restart() {
	p.s.StopPair(p.qp.Index)
	p.rx.rebuild(0, p.rx.q.LastAvail())
	p.tx.rebuild(1, p.tx.q.LastAvail())
	p.start()
}

// sendFrame queues one TX frame with a zero virtio-net header, in one
// descriptor like Linux does, without publishing.
func (p *testPair) addTX(frame []byte) uint16 {
	b := make([]byte, p.hdrLen+len(frame))
	copy(b[p.hdrLen:], frame)
	return p.tx.addChain([][]byte{b}, nil)
}

func (p *testPair) stats() *QueueStats { return p.s.PairStats(p.qp.Index) }

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

package vhostuser

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

// fakeDP is a recording DataPlane. onStart, if set, runs inside StartPair
// (on the control goroutine), e.g. to pop chains like a data plane would.
type fakeDP struct {
	mu       sync.Mutex
	events   []string
	running  map[int]virtqueue.QueuePair
	starts   []virtqueue.QueuePair
	mtus     []int
	announce [][6]byte
	failNext bool
	onStart  func(qp virtqueue.QueuePair)
}

func newFakeDP() *fakeDP { return &fakeDP{running: map[int]virtqueue.QueuePair{}} }

func (f *fakeDP) StartPair(qp virtqueue.QueuePair) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if qp.RX == nil || qp.TX == nil {
		panic("StartPair with nil queue")
	}
	if _, ok := f.running[qp.Index]; ok {
		panic(fmt.Sprintf("StartPair(%d) while running", qp.Index))
	}
	if f.failNext {
		f.failNext = false
		f.events = append(f.events, fmt.Sprintf("start-fail %d", qp.Index))
		return fmt.Errorf("fake start failure")
	}
	f.events = append(f.events, fmt.Sprintf("start %d", qp.Index))
	f.running[qp.Index] = qp
	f.starts = append(f.starts, qp)
	if f.onStart != nil {
		f.onStart(qp)
	}
	return nil
}

func (f *fakeDP) StopPair(index int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.running[index]; !ok {
		panic(fmt.Sprintf("StopPair(%d) while not running", index))
	}
	delete(f.running, index)
	f.events = append(f.events, fmt.Sprintf("stop %d", index))
}

// EndSession records the end of the guest's session; every pair must be
// stopped by then (the data plane closes flows without a loop running).
func (f *fakeDP) EndSession() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.running) != 0 {
		panic(fmt.Sprintf("EndSession with pairs running: %v", f.running))
	}
	f.events = append(f.events, "end")
}

func (f *fakeDP) SetMTU(mtu int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mtus = append(f.mtus, mtu)
}

func (f *fakeDP) Announce(mac [6]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.announce = append(f.announce, mac)
}

// takeEvents returns the events recorded since the last call, joined.
func (f *fakeDP) takeEvents() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := strings.Join(f.events, ",")
	f.events = nil
	return s
}

func (f *fakeDP) setOnStart(fn func(virtqueue.QueuePair)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onStart = fn
}

func (f *fakeDP) runningCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.running)
}

func (f *fakeDP) mtuList() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.mtus...)
}

func (f *fakeDP) pair(i int) (virtqueue.QueuePair, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	qp, ok := f.running[i]
	return qp, ok
}

// drainPopper is an onStart hook: pop every available chain of both rings
// and return it used, as a data plane consuming TX and RX would.
func drainPopper(qp virtqueue.QueuePair) {
	var c virtqueue.Chain
	for _, q := range []*virtqueue.SplitQueue{qp.RX, qp.TX} {
		for {
			ok, err := q.Pop(&c)
			if err != nil || !ok {
				break
			}
			q.Push(c.Head, 0)
		}
		q.Flush()
	}
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// guestMem is guest RAM as a front-end has it: a memfd the test maps (the
// device maps it from the fd it is sent), announced at a fake front-end
// address, with vqtest's driver on each ring.
type guestMem struct {
	mem   *vqtest.GuestMemory
	spec  MemRegion
	rings map[int]*vqtest.Driver
}

const (
	testGPA  = 0x0
	testUA   = 0x7f00_0000_0000
	testSize = 1 << 20
)

func newGuestMem(t testing.TB, gpa, ua, size uint64) *guestMem {
	return namedGuestMem(t, "vunet-test-guest", gpa, ua, size)
}

// namedGuestMem is newGuestMem with a memfd name of its own (to find its
// mappings in /proc/self/maps).
func namedGuestMem(t testing.TB, name string, gpa, ua, size uint64) *guestMem {
	t.Helper()
	m, err := vqtest.NewFrontendMemory(name, virtqueue.RegionSpec{GuestAddr: gpa, Size: size, UserAddr: ua})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &guestMem{mem: m, spec: MemRegion{GuestAddr: gpa, Size: size, UserAddr: ua}, rings: map[int]*vqtest.Driver{}}
}

// bytes is the driver's view of all of g.
func (g *guestMem) bytes() []byte { return g.mem.Bytes(g.spec.GuestAddr, g.spec.Size) }

// dupFD returns a new descriptor for the memfd (the device takes ownership
// of what it receives).
func (g *guestMem) dupFD(t testing.TB) int {
	t.Helper()
	fd, err := unix.Dup(g.mem.FD())
	if err != nil {
		t.Fatalf("dup: %v", err)
	}
	return fd
}

// Ring layout used by the tests: ring i at a fixed guest offset, its
// buffers above all rings.
const testRingSize = 8

func ringGPA(i int) uint64 { return 0x10000 + uint64(i)*0x4000 }

// ring returns the driver of ring i, taking over what is in memory (a
// copy of another guestMem's rings continues where that one stopped).
func (g *guestMem) ring(i int) *vqtest.Driver {
	d := g.rings[i]
	if d == nil {
		d = vqtest.ResumeDriver(g.mem, testRingSize, g.spec.GuestAddr+ringGPA(i),
			g.spec.GuestAddr+0x80000+uint64(i)*0x8000, 0x8000)
		g.rings[i] = d
	}
	return d
}

// ringAddr is ring i's SET_VRING_ADDR (it needs no memory: the fuzz seeds
// use it on a bare spec).
func (g *guestMem) ringAddr(i int) VringAddr {
	d, a, u := vqtest.RingLayout(testRingSize, g.spec.GuestAddr+ringGPA(i))
	ua := g.spec.UserAddr - g.spec.GuestAddr
	return VringAddr{Index: uint32(i), Desc: d + ua, Avail: a + ua, Used: u + ua}
}

// offer makes n more chains (one 64-byte buffer each) available on ring i.
func (g *guestMem) offer(i, n int, writable bool) {
	d := g.ring(i)
	d.Reclaim()
	for k := 0; k < n; k++ {
		if _, err := d.AddChain(vqtest.Buf{GPA: d.Alloc(64), Len: 64, Write: writable}); err != nil {
			panic(err)
		}
	}
	d.Publish(false)
}

func (g *guestMem) usedIdx(i int) uint16 { return g.ring(i).UsedIdx() }

// frontend is a minimal vhost-user front-end for tests: it writes requests
// (with SCM_RIGHTS descriptors) and reads replies.
type frontend struct {
	t *testing.T
	c *net.UnixConn
}

// socketPair returns two connected UNIX stream sockets.
func socketPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socketpair: %v", err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatalf("FileConn: %v", err)
		}
		conns[i] = c.(*net.UnixConn)
	}
	return conns[0], conns[1]
}

// send writes one request; fds are sent and then closed on our side.
func (fe *frontend) send(req Request, flags uint32, payload []byte, fds ...int) {
	fe.t.Helper()
	b := make([]byte, HeaderSize, HeaderSize+len(payload))
	Header{Request: req, Flags: FlagVersion1 | flags, Size: uint32(len(payload))}.Encode(b)
	b = append(b, payload...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := fe.c.WriteMsgUnix(b, oob, nil); err != nil {
		fe.t.Fatalf("send %v: %v", req, err)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// reply reads one reply and checks it answers req.
func (fe *frontend) reply(req Request) []byte {
	fe.t.Helper()
	fe.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	hb := make([]byte, HeaderSize)
	if _, err := io.ReadFull(fe.c, hb); err != nil {
		fe.t.Fatalf("read %v reply header: %v", req, err)
	}
	le := binary.LittleEndian
	if got := Request(le.Uint32(hb)); got != req {
		fe.t.Fatalf("reply to %v has request %v", req, got)
	}
	if fl := le.Uint32(hb[4:]); fl != FlagVersion1|FlagReply {
		fe.t.Fatalf("reply to %v has flags %#x", req, fl)
	}
	p := make([]byte, le.Uint32(hb[8:]))
	if _, err := io.ReadFull(fe.c, p); err != nil {
		fe.t.Fatalf("read %v reply payload: %v", req, err)
	}
	return p
}

// call sends a request that has a reply and returns the reply payload.
func (fe *frontend) call(req Request, flags uint32, payload []byte, fds ...int) []byte {
	fe.t.Helper()
	fe.send(req, flags, payload, fds...)
	return fe.reply(req)
}

func (fe *frontend) callU64(req Request) uint64 {
	fe.t.Helper()
	p := fe.call(req, 0, nil)
	v, err := DecodeU64(p)
	if err != nil {
		fe.t.Fatalf("%v reply: %v", req, err)
	}
	return v
}

// ack sends a request with NEED_REPLY and returns the acked u64.
func (fe *frontend) ack(req Request, payload []byte, fds ...int) uint64 {
	fe.t.Helper()
	p := fe.call(req, FlagNeedReply, payload, fds...)
	v, err := DecodeU64(p)
	if err != nil {
		fe.t.Fatalf("%v ack: %v", req, err)
	}
	return v
}

// sync waits until every earlier request was processed (replies are in
// order).
func (fe *frontend) sync() { fe.t.Helper(); fe.callU64(ReqGetFeatures) }

// expectClosed checks that the back-end closed the connection.
func (fe *frontend) expectClosed() {
	fe.t.Helper()
	fe.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 64)
	for {
		_, err := fe.c.Read(b)
		if err == io.EOF {
			return
		}
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				fe.t.Fatalf("connection not closed by back-end")
			}
			return // ECONNRESET counts as closed
		}
	}
}

// session runs ServeConn on one end of a socket pair and returns the
// front-end side and a channel with ServeConn's result.
func session(t *testing.T, cfg DeviceConfig) (*frontend, <-chan error) {
	t.Helper()
	a, b := socketPair(t)
	done := make(chan error, 1)
	go func() { done <- ServeConn(t.Context(), b, cfg) }()
	t.Cleanup(func() { a.Close() })
	return &frontend{t: t, c: a}, done
}

func eventfd(t testing.TB) int {
	t.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatalf("eventfd: %v", err)
	}
	return fd
}

// readEventfd returns the counter of an eventfd (0 if nothing written).
func readEventfd(t testing.TB, fd int) uint64 {
	t.Helper()
	var b [8]byte
	n, err := unix.Read(fd, b[:])
	if err == unix.EAGAIN {
		return 0
	}
	if err != nil || n != 8 {
		t.Fatalf("read eventfd: %d %v", n, err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

// openFDs counts this process's open descriptors.
// openFDs counts the test process's open descriptors. A leak check compares
// with more, never with fewer: a descriptor an earlier test's goroutine
// closes late makes the count drop (TestMessages failed on "12 open, 13
// before" once in CI).
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("list fds: %v", err)
	}
	return len(ents)
}

func u64(v uint64) []byte         { return EncodeU64(nil, v) }
func state(i, n uint32) []byte    { return VringState{Index: i, Num: n}.Encode(nil) }
func memReg(r MemRegion) []byte   { return EncodeMemRegMsg(nil, r) }
func addr(a VringAddr) []byte     { return a.Encode(nil) }
func table(r ...MemRegion) []byte { return EncodeMemTable(nil, r) }

func closeFD(fd int) { unix.Close(fd) }

func dupFD(t testing.TB, fd int) int {
	t.Helper()
	n, err := unix.Dup(fd)
	if err != nil {
		t.Fatalf("dup: %v", err)
	}
	return n
}

package vhostuser

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

// testLog is a dirty log as QEMU makes one: a memfd, mapped by the test to
// read what the back-end marked.
type testLog struct {
	fd   int
	view []byte
}

const testLogName = "vunet-test-dirty-log"

func newTestLog(t *testing.T, size int) *testLog {
	t.Helper()
	fd, err := unix.MemfdCreate(testLogName, unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	view, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(view); unix.Close(fd) })
	return &testLog{fd: fd, view: view}
}

func (l *testLog) dirty(gpa uint64) bool {
	p := gpa / virtqueue.DirtyLogPageSize
	return l.view[p/8]&(1<<(p%8)) != 0
}

func (l *testLog) pages() int {
	n := 0
	for _, b := range l.view {
		for ; b != 0; b &= b - 1 {
			n++
		}
	}
	return n
}

// mappedLogs counts our mappings of the test log's memfd.
func mappedLogs(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "/memfd:"+testLogName)
}

// rxWriter is an onStart hook that plays an RX data plane: every chain the
// guest made available on the RX ring gets 64 bytes written and is
// returned used.
func rxWriter(qp virtqueue.QueuePair) {
	var c virtqueue.Chain
	for {
		ok, err := qp.RX.Pop(&c)
		if err != nil || !ok {
			break
		}
		c.CopyToWritable(0, bytes.Repeat([]byte{0xab}, 64))
		qp.RX.Push(c.Head, 64)
	}
	qp.RX.Flush()
}

// TestMigrationDirtyLogSession plays QEMU 7.2's migration of a running
// device over a real session: SET_LOG_BASE (answered), SET_FEATURES with
// LOG_ALL (acked), SET_VRING_ADDR with VHOST_VRING_F_LOG per ring, then the
// cancel. Buffers written and used rings published while logging are
// marked in the front-end's log, at the guest-physical pages, those
// written before are not; the cancel unmaps the log.
func TestMigrationDirtyLogSession(t *testing.T) {
	g := newGuestMem(t, testGPA, testUA, testSize)
	dp := newFakeDP()
	dp.setOnStart(rxWriter)
	st := &Stats{}
	fe, done := session(t, DeviceConfig{DataPlane: dp, Logger: testLogger(t), Stats: st})
	if f := fe.callU64(ReqGetFeatures); f&FeatureLogAll == 0 {
		t.Fatalf("LOG_ALL not offered: %#x", f)
	}
	if p := fe.callU64(ReqGetProtocolFeatures); p&ProtocolLogSHMFD == 0 {
		t.Fatalf("LOG_SHMFD not offered: %#x", p)
	}
	fe.send(ReqSetProtocolFeatures, 0, u64(OfferedProtocolFeatures))
	acked := DefaultFeatures &^ FeatureLogAll
	fe.send(ReqSetFeatures, 0, u64(acked))
	if v := fe.ack(ReqAddMemReg, memReg(g.spec), g.dupFD(t)); v != 0 {
		t.Fatalf("ADD_MEM_REG ack %d", v)
	}
	g.offer(0, 2, true)
	for i := 0; i < 2; i++ {
		fe.send(ReqSetVringNum, 0, state(uint32(i), testRingSize))
		fe.send(ReqSetVringBase, 0, state(uint32(i), 0))
		fe.send(ReqSetVringAddr, 0, addr(g.ringAddr(i)))
		fe.send(ReqSetVringKick, 0, u64(uint64(i)), eventfd(t))
		fe.send(ReqSetVringCall, 0, u64(uint64(i)), eventfd(t))
		fe.send(ReqSetVringEnable, 0, state(uint32(i), 1))
	}
	fe.sync()
	if got := g.usedIdx(0); got != 2 {
		t.Fatalf("RX used idx %d before the migration, want 2", got)
	}
	d := g.ring(0)

	// Migration starts. The log covers 2 MiB (512 pages).
	log := newTestLog(t, 4096)
	if r := fe.call(ReqSetLogBase, 0, LogDesc{Size: 64, Offset: 0}.Encode(nil), dupFD(t, log.fd)); !bytes.Equal(r, u64(0)) {
		t.Fatalf("SET_LOG_BASE reply %x, want u64 0", r)
	}
	if log.pages() != 0 {
		t.Fatalf("%d pages marked before LOG_ALL", log.pages())
	}
	// The buffers the data plane writes from now on are these.
	rxBufs := []uint64{}
	d.Reclaim()
	for k := 0; k < 3; k++ {
		gpa := d.Alloc(64)
		rxBufs = append(rxBufs, gpa)
		if _, err := d.AddChain(vqtest.Buf{GPA: gpa, Len: 64, Write: true}); err != nil {
			t.Fatal(err)
		}
	}
	d.Publish(false)
	if v := fe.ack(ReqSetFeatures, u64(acked|FeatureLogAll)); v != 0 {
		t.Fatalf("SET_FEATURES(LOG_ALL) ack %d", v)
	}
	// QEMU logs the used ring at its guest-physical address.
	usedGPA := [2]uint64{g.ring(0).UsedGPA, g.ring(1).UsedGPA}
	for i := 0; i < 2; i++ {
		a := g.ringAddr(i)
		a.Flags, a.Log = VringFlagLog, usedGPA[i]
		fe.send(ReqSetVringAddr, 0, addr(a))
	}
	fe.sync()
	if got := g.usedIdx(0); got != 5 {
		t.Fatalf("RX used idx %d, want 5", got)
	}
	for _, gpa := range rxBufs {
		if !log.dirty(gpa) {
			t.Errorf("RX buffer at %#x written while logging, page not marked", gpa)
		}
	}
	for i, gpa := range usedGPA {
		if !log.dirty(gpa) {
			t.Errorf("ring %d's used ring at %#x not marked", i, gpa)
		}
	}
	// Nothing else: no readable or descriptor page, no page of ring 1.
	want := map[uint64]bool{}
	for _, gpa := range append(rxBufs, usedGPA[:]...) {
		want[gpa/virtqueue.DirtyLogPageSize] = true
	}
	if n := log.pages(); n != len(want) {
		t.Errorf("%d pages marked, want %d", n, len(want))
	}
	if w := st.Rings[0].DirtyLogWrites.Load(); w < 4 {
		t.Errorf("ring 0 counted %d logged writes, want >= 4", w)
	}
	if n := mappedLogs(t); n != 2 {
		t.Errorf("log mapped %d times, want 2 (the back-end's and the test's)", n)
	}

	// Cancel: LOG_ALL off. The back-end drops its mapping of the log.
	if v := fe.ack(ReqSetFeatures, u64(acked)); v != 0 {
		t.Fatalf("SET_FEATURES ack %d", v)
	}
	fe.sync()
	if n := mappedLogs(t); n != 1 {
		t.Errorf("after the cancel the log is mapped %d times, want only the test's", n)
	}
	// Writes after the cancel are not logged.
	clear(log.view)
	d.Reclaim()
	if _, err := d.AddChain(vqtest.Buf{GPA: d.Alloc(64), Len: 64, Write: true}); err != nil {
		t.Fatal(err)
	}
	d.Publish(false)
	fe.send(ReqSetVringAddr, 0, addr(g.ringAddr(0))) // restarts the pair: rxWriter runs
	fe.sync()
	if got := g.usedIdx(0); got != 6 || log.pages() != 0 {
		t.Errorf("after the cancel: used idx %d (want 6), %d pages marked (want 0)", got, log.pages())
	}
	fe.c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestDeviceStartsDuringMigration: QEMU starts a device while a migration
// runs with LOG_ALL and the rings first and SET_LOG_BASE last; the
// restarted pair logs from then on.
func TestDeviceStartsDuringMigration(t *testing.T) {
	g := newGuestMem(t, testGPA, testUA, testSize)
	h := newHarness(t, 1)
	defer h.d.close()
	h.dp.setOnStart(rxWriter)
	h.ok(ReqSetProtocolFeatures, u64(OfferedProtocolFeatures))
	h.ok(ReqSetFeatures, u64(DefaultFeatures))
	h.ok(ReqAddMemReg, memReg(g.spec), g.dupFD(t))
	for i := 0; i < 2; i++ {
		a := g.ringAddr(i)
		a.Flags, a.Log = VringFlagLog, g.ring(i).UsedGPA
		h.ok(ReqSetVringNum, state(uint32(i), testRingSize))
		h.ok(ReqSetVringAddr, addr(a))
		h.ok(ReqSetVringKick, u64(uint64(i)), eventfd(t))
	}
	if qp, ok := h.dp.pair(0); !ok || qp.RX.Logging() {
		t.Fatalf("pair running %v, logging without a log", ok)
	}
	g.offer(0, 1, true)
	log := newTestLog(t, 64)
	r, send, err := h.do(ReqSetLogBase, 0, LogDesc{Size: 64}.Encode(nil), dupFD(t, log.fd))
	if err != nil || !send || !bytes.Equal(r, u64(0)) {
		t.Fatalf("SET_LOG_BASE: %x %v %v", r, send, err)
	}
	qp, ok := h.dp.pair(0)
	if !ok || !qp.RX.Logging() || !qp.TX.Logging() {
		t.Fatal("pair not restarted with the log")
	}
	if !log.dirty(g.ring(0).UsedGPA) || log.pages() < 2 {
		t.Errorf("%d pages marked; the used ring and the RX buffer written after SET_LOG_BASE must be", log.pages())
	}
	// A second log replaces the first, which is unmapped (pairs stopped
	// first: nothing writes to it any more).
	log2 := newTestLog(t, 64)
	if r, _, _ := h.do(ReqSetLogBase, 0, LogDesc{Size: 64}.Encode(nil), dupFD(t, log2.fd)); !bytes.Equal(r, u64(0)) {
		t.Fatalf("second SET_LOG_BASE: %x", r)
	}
	if n := mappedLogs(t); n != 3 { // two test views and the back-end's one
		t.Errorf("%d mappings of the test logs, want 3", n)
	}
	h.ok(ReqResetDevice, nil)
	if n := mappedLogs(t); n != 2 {
		t.Errorf("after RESET_DEVICE, %d mappings of the test logs, want the test's 2", n)
	}
}

// TestSetLogBaseHostile: a log the back-end cannot use is answered with a
// failure (QEMU waits for the reply), counted, and the session goes on
// without logging; SET_LOG_BASE without LOG_SHMFD, or malformed, closes the
// connection; SET_LOG_FD is accepted and its fd not kept.
func TestSetLogBaseHostile(t *testing.T) {
	st := &Stats{}
	fe, done := session(t, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t), Stats: st})
	fe.send(ReqSetProtocolFeatures, 0, u64(OfferedProtocolFeatures))
	fe.send(ReqSetFeatures, 0, u64(DefaultFeatures))
	fds := openFDs(t)
	log := newTestLog(t, 4096)
	efd := eventfd(t)
	defer closeFD(efd)
	for _, c := range []struct {
		name string
		desc LogDesc
		fd   int
	}{
		{"zero size", LogDesc{Size: 0}, log.fd},
		{"beyond the file", LogDesc{Size: 8192}, log.fd},
		{"offset beyond the file", LogDesc{Size: 8, Offset: 1 << 40}, log.fd},
		{"unaligned offset", LogDesc{Size: 8, Offset: 3}, log.fd},
		{"odd size", LogDesc{Size: 9}, log.fd},
		{"huge", LogDesc{Size: 1 << 62}, log.fd},
		{"eventfd", LogDesc{Size: 8}, efd},
		{"pipe", LogDesc{Size: 8}, -1},
	} {
		var fd int
		if c.fd >= 0 {
			fd = dupFD(t, c.fd)
		} else {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			closeFD(p[1])
			fd = p[0]
		}
		if r := fe.call(ReqSetLogBase, 0, c.desc.Encode(nil), fd); !bytes.Equal(r, u64(1)) {
			t.Errorf("%s: reply %x, want u64 1 (failure)", c.name, r)
		}
	}
	if n := st.ErrorCount(ErrReasonInvalid); n != 8 {
		t.Errorf("%d invalid requests counted, want 8", n)
	}
	fe.send(ReqSetLogFD, 0, nil, dupFD(t, efd))
	fe.sync()
	if n := openFDs(t); n != fds+2 { // the test's log memfd and eventfd
		t.Errorf("%d fds open, want %d: the back-end kept a descriptor", n, fds+2)
	}
	if n := mappedLogs(t); n != 1 {
		t.Errorf("log mapped %d times, want the test's only", n)
	}
	// Malformed: no fd.
	fe.send(ReqSetLogBase, 0, LogDesc{Size: 8}.Encode(nil))
	fe.expectClosed()
	if err := <-done; !errors.Is(err, ErrFDCount) {
		t.Fatalf("session: %v", err)
	}

	// Without LOG_SHMFD the front-end expects no reply: the request cannot
	// be served and closes the connection.
	fe, done = session(t, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t)})
	fe.send(ReqSetProtocolFeatures, 0, u64(ProtocolReplyAck))
	fe.send(ReqSetLogBase, 0, LogDesc{Size: 8}.Encode(nil), dupFD(t, log.fd))
	fe.expectClosed()
	if err := <-done; !errors.Is(err, ErrInvalid) {
		t.Fatalf("session: %v", err)
	}
	if n := mappedLogs(t); n != 1 {
		t.Errorf("log mapped %d times, want the test's only", n)
	}
}

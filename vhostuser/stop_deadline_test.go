package vhostuser

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// hangingDP is a fakeDP whose StopPair hangs, while hang is set, until
// release is closed: a data plane stuck in something the front-end
// controls (a page fault on a FUSE-backed memory file, say).
type hangingDP struct {
	*fakeDP
	mu      sync.Mutex
	hang    bool
	release chan struct{}
	stopped chan int // StopPair returns, after a hang
}

func (h *hangingDP) StopPair(index int) {
	h.mu.Lock()
	hang := h.hang
	h.mu.Unlock()
	if hang {
		<-h.release
		defer func() { h.stopped <- index }()
	}
	h.fakeDP.StopPair(index)
}

func (h *hangingDP) setHang(on bool) {
	h.mu.Lock()
	h.hang = on
	h.mu.Unlock()
}

func (h *hangingDP) startCount() int {
	h.fakeDP.mu.Lock()
	defer h.fakeDP.mu.Unlock()
	return len(h.fakeDP.starts)
}

// guestMappings counts this process's mappings of the test guest memfd.
func guestMappings(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "vunet-test-guest")
}

// TestStopDeadline: a StopPair that does not return within StopTimeout
// abandons the pair: the front-end is disconnected, stop_timeout counted,
// and the guest memory stays mapped and the pair's descriptors open while
// the data plane may still use them. The next front-end is served, but the
// stuck pair is not started again (nor the data plane's session ended)
// until StopPair returns; then memory and descriptors are released and
// the pair starts again.
func TestStopDeadline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vu.sock")
	g := newGuestMem(t, testGPA, testUA, testSize)
	dp := &hangingDP{fakeDP: newFakeDP(), release: make(chan struct{}), stopped: make(chan int, 1)}
	st := &Stats{}
	startServe(t, ServerConfig{Path: path}, DeviceConfig{DataPlane: dp, Logger: testLogger(t), Stats: st, StopTimeout: 200 * time.Millisecond})
	// An earlier test's sessions may still be unmapping their guest
	// memory (and one abandons a pair for good): the counts below are
	// relative to a start where the mappings have stopped changing.
	mapsBefore := guestMappings(t)
	for stable, deadline := time.Now(), time.Now().Add(5*time.Second); time.Since(stable) < 200*time.Millisecond && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		if n := guestMappings(t); n != mapsBefore {
			mapsBefore, stable = n, time.Now()
		}
	}
	fdsBefore := openFDs(t)

	fe := dial(t, path)
	qemuStart(t, fe, g)
	qp, ok := dp.pair(0)
	if !ok {
		t.Fatal("pair 0 not running")
	}
	kicks := []int{qp.RX.KickFD(), qp.TX.KickFD()}
	dp.setHang(true)
	start := time.Now()
	fe.send(ReqGetVringBase, 0, state(0, 0))
	fe.expectClosed()
	fe.c.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("front-end disconnected after %v, deadline 200ms", d)
	}
	waitFor(t, func() bool { return st.Connected.Load() == 0 })
	if n := st.ErrorCount(ErrReasonStopTimeout); n != 1 {
		t.Fatalf("stop_timeout errors %d, want 1", n)
	}
	if n := guestMappings(t); n != mapsBefore+1 {
		t.Fatalf("guest memory mappings %d, want %d: unmapped under a pair that may still touch it", n, mapsBefore+1)
	}
	// The socket is closed; the pair's descriptors stay open. The kick fds
	// are checked by number (a count of this process's fds also moves with
	// earlier tests' late closes).
	for _, fd := range kicks {
		if link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)); err != nil || link != "anon_inode:[eventfd]" {
			t.Fatalf("kick fd %d after abandonment: %q, %v: the pair's descriptors were closed", fd, link, err)
		}
	}
	if ev := dp.takeEvents(); strings.Contains(ev, "end") {
		t.Fatalf("data plane session ended under a stuck pair: %q", ev)
	}

	// A new front-end is served; pair 0 stays stopped while stuck.
	dp.setHang(false)
	fe2 := dial(t, path)
	dataPlaneErrs, starts := st.ErrorCount(ErrReasonDataPlane), dp.startCount()
	qemuStartStuck(t, fe2, g)
	if dp.startCount() != starts {
		t.Fatal("stuck pair started again")
	}
	if st.ErrorCount(ErrReasonDataPlane) == dataPlaneErrs {
		t.Fatal("refused start of the stuck pair not counted")
	}
	fe2.c.Close()
	waitFor(t, func() bool { return st.Connected.Load() == 0 })

	// StopPair returns at last: everything is released.
	close(dp.release)
	if p := <-dp.stopped; p != 0 {
		t.Fatalf("stopped pair %d", p)
	}
	deadline := time.Now().Add(5 * time.Second)
	for guestMappings(t) != mapsBefore || openFDs(t) > fdsBefore {
		if time.Now().After(deadline) {
			t.Fatalf("after the stop returned: %d guest mappings (want %d), %d fds (want %d)",
				guestMappings(t), mapsBefore, openFDs(t), fdsBefore)
		}
		time.Sleep(5 * time.Millisecond)
	}
	fe3 := dial(t, path)
	qemuStart(t, fe3, g)
	if _, ok := dp.pair(0); !ok {
		t.Fatal("pair 0 not started after the stuck stop returned")
	}
}

// qemuStartStuck sets pair 0 up as qemuStart does; every message is
// accepted though the pair cannot start.
func qemuStartStuck(t *testing.T, fe *frontend, g *guestMem) {
	t.Helper()
	fe.callU64(ReqGetFeatures)
	fe.send(ReqSetProtocolFeatures, 0, u64(OfferedProtocolFeatures))
	fe.send(ReqSetFeatures, 0, u64(DefaultFeatures))
	if v := fe.ack(ReqAddMemReg, memReg(g.spec), g.dupFD(t)); v != 0 {
		t.Fatalf("ADD_MEM_REG ack %d", v)
	}
	qemuRings(t, fe, g)
}

// writerDP's StopPair writes 1 to an eventfd first, as a data plane's
// loop flushing its last interrupt would: with the counter full and
// O_NONBLOCK cleared that write blocks until someone reads the counter.
type writerDP struct {
	*fakeDP
	fd int
}

func (w *writerDP) StopPair(index int) {
	var one [8]byte
	one[0] = 1
	unix.Write(w.fd, one[:])
	w.fakeDP.StopPair(index)
}

// TestStopDrainsBlockedWriter: halfway to the deadline the pair's call
// eventfds are drained, which wakes a writer blocked on a full counter; the
// pair then stops in time and nothing is abandoned.
func TestStopDrainsBlockedWriter(t *testing.T) {
	g := newGuestMem(t, testGPA, testUA, testSize)
	call, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(call)
	dp := &writerDP{fakeDP: newFakeDP(), fd: call}
	st := &Stats{}
	var logs logBuffer
	fe, done := session(t, DeviceConfig{DataPlane: dp, Logger: logs.logger(), Stats: st, StopTimeout: 2 * time.Second})
	qemuStart(t, fe, g)
	fe.send(ReqSetVringCall, FlagNeedReply, u64(0), dupFD(t, call))
	fe.reply(ReqSetVringCall)
	readEventfd(t, call) // the signal a fresh call fd gets (non-blocking: the queue set it)
	var full [8]byte
	binary.LittleEndian.PutUint64(full[:], 0xfffffffffffffffe)
	if _, err := unix.Write(call, full[:]); err != nil {
		t.Fatal(err)
	}
	unix.SetNonblock(call, false)
	start := time.Now()
	if r := fe.call(ReqGetVringBase, 0, state(0, 0)); len(r) != 8 {
		t.Fatalf("GET_VRING_BASE reply %x", r)
	}
	t.Logf("stopped after %v", time.Since(start).Round(time.Millisecond))
	if n := st.ErrorCount(ErrReasonStopTimeout); n != 0 {
		t.Fatalf("pair abandoned (%d) though draining woke its writer", n)
	}
	if !strings.Contains(logs.String(), "stopped only after its eventfds were drained") {
		t.Fatalf("log:\n%s", logs.String())
	}
	fe.c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestStopDeadlineKeepsDirtyLog: a pair abandoned during a migration
// keeps the dirty log its queues mark mapped: the session's end does not
// unmap it under the stuck loop (whose marks would go to unmapped memory,
// or to whatever is mapped there next); once its StopPair returns, it is.
func TestStopDeadlineKeepsDirtyLog(t *testing.T) {
	g := newGuestMem(t, testGPA, testUA, testSize)
	dp := &hangingDP{fakeDP: newFakeDP(), release: make(chan struct{}), stopped: make(chan int, 1)}
	st := &Stats{}
	fe, done := session(t, DeviceConfig{DataPlane: dp, Logger: testLogger(t), Stats: st, StopTimeout: 200 * time.Millisecond})
	qemuStart(t, fe, g)
	logMaps := func() int {
		b, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), testLogName)
	}
	log := newTestLog(t, 4096) // the test's own view: one mapping
	before := logMaps()
	if r := fe.call(ReqSetLogBase, 0, LogDesc{Size: 64}.Encode(nil), dupFD(t, log.fd)); !bytes.Equal(r, u64(0)) {
		t.Fatalf("SET_LOG_BASE reply %x", r)
	}
	if n := logMaps(); n != before+1 {
		t.Fatalf("%d log mappings after SET_LOG_BASE, want %d", n, before+1)
	}
	// LOG_ALL on restarts the pair with the log; the stop hangs.
	dp.setHang(true)
	fe.send(ReqSetFeatures, 0, u64(DefaultFeatures))
	fe.expectClosed()
	fe.c.Close()
	<-done
	if n := st.ErrorCount(ErrReasonStopTimeout); n != 1 {
		t.Fatalf("stop_timeout errors %d, want 1", n)
	}
	if n := logMaps(); n != before+1 {
		t.Fatalf("%d log mappings after the session ended, want %d: the log was unmapped under the abandoned pair", n, before+1)
	}
	close(dp.release)
	<-dp.stopped
	waitFor(t, func() bool { return logMaps() == before })
}

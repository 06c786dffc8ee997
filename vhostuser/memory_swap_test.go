package vhostuser

import (
	"errors"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"vunet/virtqueue"

	"golang.org/x/sys/unix"
)

// mappingsOf counts this process's mappings of memfds named name.
func mappingsOf(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "/memfd:"+name+" ")
}

// TestMemorySwapFaultUnmapsOld: a new memory table whose file shrinks while
// the pairs are restarted on it faults in the middle of the swap; the
// connection goes, and the old table's mappings must be released, not
// leaked (the device already points at the new table).
func TestMemorySwapFaultUnmapsOld(t *testing.T) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true)) // as serveSession
	oldMem := namedGuestMem(t, "vunet-swap-old", testGPA, testUA, testSize)
	newMem := namedGuestMem(t, "vunet-swap-new", testGPA, testUA, testSize)
	h := newHarness(t, 2)
	h.negotiate(OfferedProtocolFeatures)
	h.ok(ReqSetMemTable, table(oldMem.spec), oldMem.dupFD(t))
	h.setupPair(oldMem, 0, true)
	h.setupPair(oldMem, 1, true)
	if !h.d.running[0] || !h.d.running[1] {
		t.Fatalf("pairs not running")
	}
	if n := mappingsOf(t, "vunet-swap-old"); n != 2 {
		t.Fatalf("old memfd mapped %d times, want 2 (test and device)", n)
	}
	copy(newMem.bytes(), oldMem.bytes())
	// Once pair 0 runs on the new table, the front-end cuts the file below
	// pair 1's rings: building pair 1's queues faults.
	d1 := ringGPA(2)
	h.dp.setOnStart(func(qp virtqueue.QueuePair) {
		if qp.Index == 0 {
			unix.Ftruncate(newMem.mem.FD(), int64(d1))
		}
	})
	_, send, err := h.do(ReqSetMemTable, 0, table(newMem.spec), newMem.dupFD(t))
	if !errors.Is(err, errMemory) || send {
		t.Fatalf("fault during the swap: send %v err %v, want a memory error", send, err)
	}
	if n := mappingsOf(t, "vunet-swap-old"); n != 1 {
		t.Fatalf("old memfd mapped %d times after the swap, want 1 (the test's own): leaked", n)
	}
	h.d.close()
	if n := mappingsOf(t, "vunet-swap-new"); n != 1 {
		t.Fatalf("new memfd mapped %d times after close, want 1", n)
	}
}

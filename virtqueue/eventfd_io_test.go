package virtqueue_test

import (
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
)

// hostileEventfd is an eventfd as a hostile front-end leaves it: blocking
// (O_NONBLOCK cleared on the shared file) and its counter at v.
func hostileEventfd(t *testing.T, v uint64) int {
	t.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if v > 0 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v)
		if _, err := unix.Write(fd, b[:]); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

// clearNonblockLater clears O_NONBLOCK again once the queue was built (as
// the front-end can at any time on its copy).
func clearNonblock(t *testing.T, fds ...int) {
	t.Helper()
	for _, fd := range fds {
		if err := unix.SetNonblock(fd, false); err != nil {
			t.Fatal(err)
		}
	}
}

// within fails the test if fn does not return within 5 s.
func within(t *testing.T, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatalf("%s blocked", what)
		return nil
	}
}

// TestEventfdIONeverBlocks: a front-end clears O_NONBLOCK on the eventfds
// it handed over and fills the call and error counters to their maximum;
// Signal, SignalErr and DrainKick (on an empty kick counter) still return
// at once, and the counters hold the signals (saturated, or +1).
func TestEventfdIONeverBlocks(t *testing.T) {
	const max = 0xfffffffffffffffe
	r := newRig(t, rigOpt{size: 8})
	call, errFD, kick := hostileEventfd(t, max), hostileEventfd(t, max), hostileEventfd(t, 0)
	cfg := r.cfg
	cfg.Call, cfg.Err, cfg.Kick = call, errFD, kick
	q, err := virtqueue.NewSplitQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	clearNonblock(t, call, errFD, kick)
	for i := 0; i < 3; i++ {
		if err := within(t, "Signal on a full blocking eventfd", q.Signal); err != nil {
			t.Fatal(err)
		}
		if err := within(t, "SignalErr on a full blocking eventfd", q.SignalErr); err != nil {
			t.Fatal(err)
		}
		if err := within(t, "DrainKick on an empty blocking eventfd", q.DrainKick); err != nil {
			t.Fatal(err)
		}
	}
	unix.SetNonblock(call, true)
	if got := readEventfd(t, call); got < max {
		t.Fatalf("call counter %#x after signals on a full counter", got)
	}
	// Room again: a signal adds exactly 1.
	clearNonblock(t, call)
	if err := within(t, "Signal", q.Signal); err != nil {
		t.Fatal(err)
	}
	unix.SetNonblock(call, true)
	if got := readEventfd(t, call); got != 1 {
		t.Fatalf("call counter %d after one signal, want 1", got)
	}
	// Kicks are still read and counted from a blocking fd.
	writeEventfd(t, kick, 5)
	clearNonblock(t, kick)
	if err := within(t, "DrainKick", q.DrainKick); err != nil || r.stats.Kicks.Load() != 5 {
		t.Fatalf("DrainKick: %v, kicks %d", err, r.stats.Kicks.Load())
	}
}

// TestClearEventfd wakes a writer blocked on a full counter.
func TestClearEventfd(t *testing.T) {
	fd := hostileEventfd(t, 0xfffffffffffffffe)
	wrote := make(chan struct{})
	go func() {
		var b [8]byte
		b[0] = 1
		unix.Write(fd, b[:]) // blocks: counter full, O_NONBLOCK clear
		close(wrote)
	}()
	time.Sleep(20 * time.Millisecond)
	if err := within(t, "ClearEventfd", func() error { return virtqueue.ClearEventfd(fd) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wrote:
	case <-time.After(5 * time.Second):
		t.Fatal("blocked writer not woken")
	}
	if err := within(t, "ClearEventfd on an empty blocking eventfd", func() error { return virtqueue.ClearEventfd(fd) }); err != nil {
		t.Fatal(err)
	}
}

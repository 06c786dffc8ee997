package virtqueue

import (
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSignalFallbackDoesNotBlock: without AIO, a signal on an eventfd whose
// counter is full and whose O_NONBLOCK was cleared is skipped (poll says
// it has no room: an interrupt is pending), not written.
func TestSignalFallbackDoesNotBlock(t *testing.T) {
	saved := aioCtx.Swap(0)
	defer aioCtx.Store(saved)
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], 0xfffffffffffffffe)
	unix.Write(fd, b[:])
	var e eventfdIO
	done := make(chan error, 1)
	go func() { done <- e.signal(fd) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("fallback signal blocked on a full counter")
	}
	if v, err := e.read(fd); err != nil || v != 0xfffffffffffffffe {
		t.Fatalf("counter %#x, %v", v, err)
	}
	if err := e.signal(fd); err != nil {
		t.Fatal(err)
	}
	if v, err := e.read(fd); err != nil || v != 1 {
		t.Fatalf("counter %d after a fallback signal, %v", v, err)
	}
}

// TestSignalAIOReaps: every signal arrives, well past the AIO ring's size
// (its completions are reaped when it fills), one eventfd at a time and
// two with one io_submit (signalPair; the ring's last slot takes only the
// first of two, and the second goes alone).
func TestSignalAIOReaps(t *testing.T) {
	setupAIO(nil)
	if aioCtx.Load() == 0 {
		t.Skip("no AIO here: the fallback is tested above")
	}
	for _, pair := range []bool{false, true} {
		fds := []int{-1, -1}
		for i := range fds {
			fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			fds[i] = fd
		}
		var e, f eventfdIO
		other := (*eventfdIO)(nil)
		if pair {
			other = &f
		} else {
			fds = fds[:1]
		}
		const n = 20 * aioRingEvents
		got := make([]uint64, len(fds))
		count := func() {
			for j, fd := range fds {
				v, _ := e.read(fd)
				got[j] += v
			}
		}
		for i := 0; i < n; i++ {
			ofd := -1
			if pair {
				ofd = fds[1]
			}
			if err, oerr := e.signalPair(fds[0], other, ofd); err != nil || oerr != nil {
				t.Fatalf("pair %v, signal %d: %v, %v", pair, i, err, oerr)
			}
			if i%1000 == 999 {
				count()
			}
		}
		count()
		for j := range fds {
			if got[j] != n {
				t.Fatalf("pair %v, eventfd %d: %d signals counted, sent %d", pair, j, got[j], n)
			}
		}
		if aioCtx.Load() == 0 {
			t.Fatal("AIO switched off on the way")
		}
	}
}

// BenchmarkEventfdSignal compares the AIO signal with the poll-then-write
// fallback and a plain write (what the queue did before, and what blocks).
func BenchmarkEventfdSignal(b *testing.B) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	setupAIO(nil)
	var e eventfdIO
	drain := func(i int) {
		if i%1024 == 0 {
			e.read(fd)
		}
	}
	b.Run("aio", func(b *testing.B) {
		if aioCtx.Load() == 0 {
			b.Skip("no AIO")
		}
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if err := e.signal(fd); err != nil {
				b.Fatal(err)
			}
			drain(i)
		}
	})
	b.Run("poll-write", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if err := e.pollWrite(fd); err != nil {
				b.Fatal(err)
			}
			drain(i)
		}
	})
	b.Run("write", func(b *testing.B) {
		var one [8]byte
		one[0] = 1
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			unix.Write(fd, one[:])
			drain(i)
		}
	})
}

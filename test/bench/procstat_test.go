package main

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// rssSlackKiB is how far /proc/PID/status may lag the truth: on Linux 6.2
// to 6.15 its RSS counters are per-CPU and read without summing them
// exactly, off by up to a batch of max(32, 2×CPUs) pages per CPU.
func rssSlackKiB() int64 {
	n := int64(runtime.NumCPU())
	return max(4<<10, n*max(32, 2*n)*int64(os.Getpagesize()>>10))
}

// rssTestStart gives a memory test its slack (KiB), the size of memory to
// touch (bytes, well above the slack) and this process's split before.
func rssTestStart(t *testing.T) (slackKiB int64, size int, before rssSplit) {
	t.Helper()
	slackKiB = rssSlackKiB()
	before, err := readRSSSplit(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return slackKiB, int(4 * slackKiB << 10), before
}

// mapTouched maps size bytes of fd (-1: anonymous memory) with flags,
// writes one byte per page, and returns the mapping and the process's
// memory split after the writes.
func mapTouched(t *testing.T, fd, size, flags int) ([]byte, rssSplit) {
	t.Helper()
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	for i := 0; i < len(b); i += os.Getpagesize() {
		b[i] = 1
	}
	m, err := readRSSSplit(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return b, m
}

// TestReadRSSSplit touches shared memory (a memfd, as a front-end's guest
// memory is) and then anonymous memory, and checks that each lands in its
// own field and that only the anonymous memory counts as the process's
// own: the bench's RSS-less-shared-memory row depends on both.
func TestReadRSSSplit(t *testing.T) {
	slack, size, before := rssTestStart(t)
	fd, err := unix.MemfdCreate("rss-split-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	_, afterShared := mapTouched(t, fd, size, unix.MAP_SHARED)
	if d := afterShared.shmemKiB - before.shmemKiB; d < int64(size>>10)-slack {
		t.Errorf("RssShmem grew %d KiB after touching %d KiB of a shared memfd", d, size>>10)
	}
	if d := afterShared.ownKiB() - before.ownKiB(); d > slack {
		t.Errorf("own memory grew %d KiB after touching only shared memory", d)
	}

	_, afterPrivate := mapTouched(t, -1, size, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if d := afterPrivate.anonKiB - afterShared.anonKiB; d < int64(size>>10)-slack {
		t.Errorf("RssAnon grew %d KiB after touching %d KiB of anonymous memory", d, size>>10)
	}
	if d := afterPrivate.ownKiB() - afterShared.ownKiB(); d < int64(size>>10)-slack {
		t.Errorf("own memory grew %d KiB after touching %d KiB of anonymous memory", d, size>>10)
	}
	if d := afterPrivate.shmemKiB - afterShared.shmemKiB; d > slack {
		t.Errorf("RssShmem grew %d KiB after touching only anonymous memory", d)
	}
}

// TestOwnPeak maps and touches anonymous memory while a watcher samples,
// then unmaps it before stopping the watcher: the peak must still hold it,
// as the bench's row must hold what a back-end used mid-round and gave
// back before the round's end.
func TestOwnPeak(t *testing.T) {
	slack, size, base := rssTestStart(t)
	pid := os.Getpid()
	w := watchOwnRSS(pid)
	t.Cleanup(func() { w.Stop() })
	private, _ := mapTouched(t, -1, size, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	// Two samples after the touch: the second surely saw it.
	waitSamples(t, w, w.taken.Load()+2)
	if err := unix.Munmap(private); err != nil {
		t.Fatal(err)
	}
	end, err := readRSSSplit(pid)
	if err != nil {
		t.Fatal(err)
	}
	peak, _, err := w.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if d := peak.ownKiB() - base.ownKiB(); d < int64(size>>10)-slack {
		t.Errorf("peak own memory %d KiB above the start, want about %d (the memory touched, then unmapped)", d, size>>10)
	}
	if d := end.ownKiB() - base.ownKiB(); d > slack {
		t.Errorf("own memory still %d KiB above the start after the unmap: the test cannot tell a peak from the last sample", d)
	}
	if _, _, err := w.Stop(); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
}

// TestOwnPeakProcessGone watches a process that exits: sampling must end
// with an error, not keep a peak that reads as the whole round's (or go
// on reading a pid the kernel may give to another process).
func TestOwnPeakProcessGone(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := watchOwnRSS(cmd.Process.Pid)
	t.Cleanup(func() { w.Stop() })
	waitSamples(t, w, 1)
	cmd.Process.Kill()
	cmd.Wait()
	select {
	case <-w.done: // the sampling ended by itself
	case <-time.After(10 * time.Second):
		t.Fatal("still sampling 10 s after the process was reaped")
	}
	peak, n, err := w.Stop()
	if err == nil {
		t.Fatalf("Stop after the process exited: no error (peak %d KiB of %d samples)", peak.ownKiB(), n)
	}
	if n < 1 || peak.ownKiB() == 0 {
		t.Errorf("Stop: %d samples, peak %d KiB: want the samples taken while it ran", n, peak.ownKiB())
	}
}

// waitSamples waits until w has taken n samples.
func waitSamples(t *testing.T, w *ownPeak, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for w.taken.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d samples in 30 s, want %d", w.taken.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

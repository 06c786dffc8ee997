package main

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadRSSSplit touches 16 MiB of shared memory (a memfd, as a
// front-end's guest memory is) and then 16 MiB of anonymous memory, and
// checks that each lands in its own field: the bench's RSS-less-guest-
// memory row depends on shared memory not counting as the back-end's own.
func TestReadRSSSplit(t *testing.T) {
	const size = 16 << 20
	const slackKiB = 4 << 10 // the kernel's per-CPU RSS counters are approximate
	pid := os.Getpid()
	touch := func(b []byte) {
		for i := 0; i < len(b); i += os.Getpagesize() {
			b[i] = 1
		}
	}

	before, err := readRSSSplit(pid)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.MemfdCreate("rss-split-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	shared, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(shared)
	touch(shared)
	afterShared, err := readRSSSplit(pid)
	if err != nil {
		t.Fatal(err)
	}
	if d := afterShared.shmemKiB - before.shmemKiB; d < size/1024-slackKiB {
		t.Errorf("RssShmem grew %d KiB after touching %d KiB of a shared memfd", d, size/1024)
	}
	if d := afterShared.anonKiB - before.anonKiB; d > slackKiB {
		t.Errorf("RssAnon grew %d KiB after touching only shared memory", d)
	}

	private, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(private)
	touch(private)
	afterPrivate, err := readRSSSplit(pid)
	if err != nil {
		t.Fatal(err)
	}
	if d := afterPrivate.anonKiB - afterShared.anonKiB; d < size/1024-slackKiB {
		t.Errorf("RssAnon grew %d KiB after touching %d KiB of anonymous memory", d, size/1024)
	}
	if d := afterPrivate.shmemKiB - afterShared.shmemKiB; d > slackKiB {
		t.Errorf("RssShmem grew %d KiB after touching only anonymous memory", d)
	}
}

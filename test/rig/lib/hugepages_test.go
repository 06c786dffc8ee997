package rig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeHugepageFiles points every kernel file at a name in a fresh
// directory, none of them made yet.
func fakeHugepageFiles(t *testing.T) hugepageFiles {
	dir := t.TempDir()
	return hugepageFiles{
		meminfo:       filepath.Join(dir, "meminfo"),
		nrHugepages:   filepath.Join(dir, "nr_hugepages"),
		compactMemory: filepath.Join(dir, "compact_memory"),
		mounts:        filepath.Join(dir, "mounts"),
		mountPoint:    filepath.Join(dir, "hugepages"),
	}
}

// TestEnsureHugepagesFailureRestores runs EnsureHugepages against plain
// files standing in for a kernel that never frees the pages asked for: it
// must return an error (not panic in its clean-up, as it did in CI when the
// kernel was short of 2 MiB blocks), and put the page count back.
func TestEnsureHugepagesFailureRestores(t *testing.T) {
	h := fakeHugepageFiles(t)
	write := func(path, s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(h.meminfo, "HugePages_Total:       1\nHugePages_Free:        1\n")
	write(h.nrHugepages, "1\n")
	write(h.mounts, "")
	write(h.compactMemory, "") // as /proc has it: ensure writes, never creates

	restore, err := h.ensure(96)
	if err == nil || restore != nil {
		t.Fatalf("ensure(96) with 1 free page = (%v, %v), want an error and no restore", restore != nil, err)
	}
	if !strings.Contains(err.Error(), "only 1 free of the 96 wanted") {
		t.Errorf("error %q does not say how many pages were free", err)
	}
	got, _ := os.ReadFile(h.nrHugepages)
	if string(got) != "1" {
		t.Errorf("nr_hugepages after the failure = %q, want the old count 1", got)
	}
	if c, _ := os.ReadFile(h.compactMemory); string(c) != "1" {
		t.Errorf("compact_memory = %q: memory was not compacted before giving up", c)
	}
	if _, err := os.Stat(h.mountPoint); !os.IsNotExist(err) {
		t.Errorf("mount point made before the page check failed: %v", err)
	}
}

// TestEnsureHugepagesEnoughFree asks for no more than are free: nothing is
// written and restore is a no-op.
func TestEnsureHugepagesEnoughFree(t *testing.T) {
	h := fakeHugepageFiles(t)
	for path, s := range map[string]string{
		h.meminfo: "HugePages_Free:       96\n",
		h.mounts:  "nodev /dev/hugepages hugetlbfs rw 0 0\n",
	} {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	restore, err := h.ensure(96)
	if err != nil || restore == nil {
		t.Fatalf("ensure(96) with 96 free = (%v, %v)", restore != nil, err)
	}
	restore()
	if _, err := os.Stat(h.nrHugepages); !os.IsNotExist(err) {
		t.Errorf("nr_hugepages written with enough pages free: %v", err)
	}
}

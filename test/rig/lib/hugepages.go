package rig

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// hugepageFiles names the kernel files EnsureHugepages reads and writes;
// tests point them at plain files to reach the error paths.
type hugepageFiles struct {
	meminfo, nrHugepages, compactMemory, mounts, mountPoint string
}

var systemHugepageFiles = hugepageFiles{
	meminfo:       "/proc/meminfo",
	nrHugepages:   "/proc/sys/vm/nr_hugepages",
	compactMemory: "/proc/sys/vm/compact_memory",
	mounts:        "/proc/mounts",
	mountPoint:    "/dev/hugepages",
}

// EnsureHugepages makes at least pages free 2 MiB hugepages available and a
// hugetlbfs mounted (root); restore puts back the page count and unmounts
// what it mounted.
func EnsureHugepages(pages int) (restore func(), err error) {
	return systemHugepageFiles.ensure(pages)
}

func (h hugepageFiles) ensure(pages int) (restore func(), err error) {
	var undo []func()
	// undoAll is its own variable: an error return sets the named result
	// restore to nil before the deferred clean-up runs.
	undoAll := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			undoAll()
		}
	}()
	free, err := h.meminfoValue("HugePages_Free")
	if err != nil {
		return nil, err
	}
	if free < pages {
		raw, err := os.ReadFile(h.nrHugepages)
		if err != nil {
			return nil, err
		}
		before := strings.TrimSpace(string(raw))
		total, _ := strconv.Atoi(before)
		want := total + pages - free
		if err := os.WriteFile(h.nrHugepages, []byte(strconv.Itoa(want)), 0); err != nil {
			return nil, fmt.Errorf("raise %s to %d: %w", h.nrHugepages, want, err)
		}
		// Pages still in use by someone else stay: the kernel only
		// releases free ones.
		undo = append(undo, func() { _ = os.WriteFile(h.nrHugepages, []byte(before), 0) })
		if free, _ = h.meminfoValue("HugePages_Free"); free < pages {
			// Too few free 2 MiB blocks (seen in CI after a long run of
			// other tests): compact memory and ask again before giving up.
			_ = os.WriteFile(h.compactMemory, []byte("1"), 0)
			if err := os.WriteFile(h.nrHugepages, []byte(strconv.Itoa(want)), 0); err != nil {
				return nil, fmt.Errorf("raise %s to %d after compaction: %w", h.nrHugepages, want, err)
			}
			if free, _ = h.meminfoValue("HugePages_Free"); free < pages {
				return nil, fmt.Errorf("hugepages: only %d free of the %d wanted (pool raised to %d), even after compacting memory", free, pages, want)
			}
		}
	}
	mounts, err := os.ReadFile(h.mounts)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(string(mounts), " hugetlbfs ") {
		if _, err := os.Stat(h.mountPoint); os.IsNotExist(err) {
			if err := os.MkdirAll(h.mountPoint, 0o755); err != nil {
				return nil, err
			}
			undo = append(undo, func() { _ = os.Remove(h.mountPoint) })
		}
		if err := unix.Mount("nodev", h.mountPoint, "hugetlbfs", 0, ""); err != nil {
			return nil, fmt.Errorf("mount hugetlbfs on %s: %w", h.mountPoint, err)
		}
		undo = append(undo, func() { _ = unix.Unmount(h.mountPoint, 0) })
	}
	return undoAll, nil
}

func (h hugepageFiles) meminfoValue(key string) (int, error) {
	v, err := ProcField(h.meminfo, key)
	return int(v), err
}

package dpdk

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func meminfo(key string) (int, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == key {
			return strconv.Atoi(strings.Fields(v)[0])
		}
	}
	return 0, fmt.Errorf("%s not in /proc/meminfo", key)
}

const nrHugepages = "/proc/sys/vm/nr_hugepages"

// EnsureHugepages makes at least pages free 2 MiB hugepages available and a
// hugetlbfs mounted, restoring the previous page count and unmounting what
// it mounted when t ends. It needs root.
func EnsureHugepages(t testing.TB, pages int) {
	t.Helper()
	free, err := meminfo("HugePages_Free")
	if err != nil {
		t.Fatalf("hugepages: %v", err)
	}
	if free < pages {
		raw, err := os.ReadFile(nrHugepages)
		if err != nil {
			t.Fatalf("hugepages: %v", err)
		}
		before := strings.TrimSpace(string(raw))
		total, _ := strconv.Atoi(before)
		want := total + pages - free
		if err := os.WriteFile(nrHugepages, []byte(strconv.Itoa(want)), 0); err != nil {
			t.Fatalf("raise %s to %d: %v", nrHugepages, want, err)
		}
		t.Cleanup(func() { _ = os.WriteFile(nrHugepages, []byte(before), 0) })
		if free, _ = meminfo("HugePages_Free"); free < pages {
			t.Fatalf("hugepages: only %d free after asking for %d (memory fragmented?)", free, want)
		}
	}
	mounts, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Fatalf("hugepages: %v", err)
	}
	if !strings.Contains(string(mounts), " hugetlbfs ") {
		_, err := os.Stat("/dev/hugepages")
		madeDir := os.IsNotExist(err)
		if err := os.MkdirAll("/dev/hugepages", 0o755); err != nil {
			t.Fatalf("mkdir /dev/hugepages: %v", err)
		}
		if err := unix.Mount("nodev", "/dev/hugepages", "hugetlbfs", 0, ""); err != nil {
			t.Fatalf("mount hugetlbfs: %v", err)
		}
		t.Cleanup(func() {
			_ = unix.Unmount("/dev/hugepages", 0)
			if madeDir {
				_ = os.Remove("/dev/hugepages")
			}
		})
	}
}

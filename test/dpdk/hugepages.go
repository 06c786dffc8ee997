package dpdk

import (
	"testing"

	rig "vunet/test/rig/lib"
)

// EnsureHugepages makes at least pages free 2 MiB hugepages available and a
// hugetlbfs mounted, restoring the previous page count and unmounting what
// it mounted when t ends. It needs root.
func EnsureHugepages(t testing.TB, pages int) {
	t.Helper()
	restore, err := rig.EnsureHugepages(pages)
	if err != nil {
		t.Fatalf("hugepages: %v", err)
	}
	t.Cleanup(restore)
}

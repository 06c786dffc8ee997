package rig

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// ProcCPU follows the process's own CPU time: a busy tenth of a second
// shows in user time, and a process that does not exist is an error.
func TestProcCPU(t *testing.T) {
	u0, s0, err := ProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
	}
	u1, s1, err := ProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u1 <= u0 || s1 < s0 {
		t.Fatalf("user %v → %v s, system %v → %v s over a busy tenth of a second", u0, u1, s0, s1)
	}
	if _, _, err := ProcCPU(-1); err == nil {
		t.Fatal("no error for pid -1")
	}
}

// ProcFields gives keys then optional keys in the order asked, whatever
// the file's order; a missing optional key reads 0, a missing key or one
// without a number is an error; ProcField is its one-key case.
func TestProcFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), "status")
	text := "Name:\tvunet\nRssFile:\t   12504 kB\nRssAnon:\t   19236 kB\nThreads:\t7\nRssShmem:\t   32816 kB\nBroken:\t\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := ProcFields(path, []string{"RssAnon", "RssFile", "RssShmem"}, []string{"HugetlbPages", "Threads"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{19236, 12504, 32816, 0, 7}; !slices.Equal(v, want) {
		t.Errorf("ProcFields = %v, want %v", v, want)
	}
	if n, err := ProcField(path, "Threads"); err != nil || n != 7 {
		t.Errorf("ProcField Threads = %d, %v; want 7", n, err)
	}
	for _, keys := range [][]string{{"RssAnon", "HugetlbPages"}, {"Broken"}, {"Name"}} {
		if v, err := ProcFields(path, keys, nil); err == nil {
			t.Errorf("ProcFields %v = %v, want an error", keys, v)
		}
	}
}

package rig

import (
	"os"
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

package qemu

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestStuckFor tells a process asleep with no CPU time moving (stuck) from
// one that keeps running (slow), and stops at its exit.
func TestStuckFor(t *testing.T) {
	start := func(script string) (*exec.Cmd, chan struct{}) {
		cmd := exec.Command("sh", "-c", script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		t.Cleanup(func() { cmd.Process.Kill(); <-exited })
		return cmd, exited
	}

	cmd, exited := start("exec sleep 60")
	stuck, ts := stuckFor(cmd.Process.Pid, exited, 300*time.Millisecond, 10*time.Second)
	if !stuck || len(ts) != 1 || ts[0].state != 'S' || ts[0].comm != "sleep" {
		t.Fatalf("sleep: stuck=%v, threads:\n%s", stuck, formatThreads(ts))
	}
	if r := formatThreads(ts); !strings.Contains(r, "wchan=") {
		t.Errorf("report without wchan: %s", r)
	}

	cmd, exited = start("while :; do :; done")
	t0 := time.Now()
	if stuck, ts := stuckFor(cmd.Process.Pid, exited, 300*time.Millisecond, 1500*time.Millisecond); stuck || time.Since(t0) < 1500*time.Millisecond {
		t.Fatalf("busy loop: stuck=%v after %v, threads:\n%s", stuck, time.Since(t0), formatThreads(ts))
	}

	cmd, exited = start("sleep 0.3")
	t0 = time.Now()
	if stuck, _ := stuckFor(cmd.Process.Pid, exited, 5*time.Second, 10*time.Second); stuck || time.Since(t0) > 4*time.Second {
		t.Fatalf("exiting process: stuck=%v after %v", stuck, time.Since(t0))
	}
}

package rig

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestRigTeardown: Close leaves no namespace, process or directory behind,
// and Sweep removes what a dead run left.
func TestRigTeardown(t *testing.T) {
	needRig(t)
	r, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	peer, err := r.StartHost("sleeper", "sleep", "600")
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	pids := []int{r.BackendPID(), peer}
	names := []string{r.GuestNetns(), r.HostNetns()}
	dir := r.Dir()
	if err := r.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("process %d still alive after Close", pid)
		}
	}
	for _, n := range names {
		if _, err := os.Stat(netnsDir + "/" + n); err == nil {
			t.Errorf("namespace %s still there after Close", n)
		}
	}
	if _, err := os.Stat(dir); err == nil && os.Getenv("VUNET_RIG_KEEP") == "" {
		t.Errorf("work directory %s still there after Close", dir)
	}

	// A dead run's leftovers: a namespace named after a pid that is gone,
	// with a process still inside.
	stale := namePrefix + "999999999-1-guest"
	if err := addNetns(stale); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { delNetns(stale) })
	cmd := exec.Command("ip", "netns", "exec", stale, "sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if got := Stale(); !contains(got, stale) {
		t.Fatalf("Stale() = %v, want it to list %s", got, stale)
	}
	if err := Sweep(); err != nil {
		t.Errorf("sweep: %v", err)
	}
	if _, err := os.Stat(netnsDir + "/" + stale); err == nil {
		t.Errorf("sweep left %s", stale)
	}
	// Sweep's SIGKILL ends the process; Wait reaps it.
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(3 * time.Second):
		cmd.Process.Kill()
		t.Errorf("sweep left process %d inside %s", cmd.Process.Pid, stale)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

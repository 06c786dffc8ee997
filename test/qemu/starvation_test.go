package qemu

import (
	"os/exec"
	"runtime"
	"testing"
	"time"
)

// TestStarvation counts the time a process waits for a CPU: none for one
// that sleeps, a good part of the wall time for one of more busy loops
// than CPUs.
func TestStarvation(t *testing.T) {
	start := func(script string) *exec.Cmd {
		cmd := exec.Command("sh", "-c", script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	sleeper := newStarvation(start("exec sleep 60").Process.Pid)
	time.Sleep(100 * time.Millisecond)
	sleeper.sample() // past the exec
	before := sleeper.total
	busy := newStarvation(start("while :; do :; done").Process.Pid)
	for i := 0; i < 2*runtime.NumCPU(); i++ {
		start("while :; do :; done")
	}
	time.Sleep(time.Second)
	if d := sleeper.sample() - before; d > 20*time.Millisecond {
		t.Errorf("a sleeping process waited %v for a CPU", d)
	}
	if d := busy.sample(); d < 200*time.Millisecond || d > 1500*time.Millisecond {
		t.Errorf("one of %d busy loops on %d CPUs waited %v of 1 s for a CPU", 2*runtime.NumCPU()+1, runtime.NumCPU(), d)
	}
	dl := newLoadDeadline(busy.pid, 300*time.Millisecond)
	time.Sleep(400 * time.Millisecond)
	if dl.expired() {
		t.Errorf("a starved process's 300 ms timeout expired after 400 ms: %v", dl)
	}
}

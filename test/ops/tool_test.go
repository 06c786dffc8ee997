package ops

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// toolProcess is a long-running operator tool a test started (Prometheus).
type toolProcess struct {
	Log  string // stdout and stderr
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startTool runs argv in its own process group with output to dir/name.log;
// t.Cleanup kills the group (it is a test fixture: nothing to flush) and
// prints the log's tail when the test failed.
func startTool(t *testing.T, dir, name string, argv []string) *toolProcess {
	t.Helper()
	p := &toolProcess{Log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.Log)
	if err != nil {
		t.Fatalf("%s log: %v", name, err)
	}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	t.Logf("%s: %s (pid %d)", name, strings.Join(argv, " "), p.cmd.Process.Pid)
	go func() {
		p.err = p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Errorf("%s (pid %d) still running 10s after SIGKILL", name, p.cmd.Process.Pid)
		}
		if t.Failed() {
			t.Logf("%s log tail (%s):\n%s", name, p.Log, tail(p.Log, 30))
		}
	})
	return p
}

// exited reports whether the tool has ended (it should not, during a test).
func (p *toolProcess) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail returns the last n lines of a file, for failure messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// process is a child the demo started and must end: vunet or QEMU.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit status, valid once done is closed
}

// startProcess starts argv in its own process group, so that stopping it
// reaches anything it forks. Pdeathsig ends the child with the demo even
// when the demo itself is killed and cannot clean up.
// stderr, when not nil, receives the child's standard error through a pipe
// that is drained before the exit is reported.
func startProcess(name string, argv []string, stdout io.Writer, stderr func(io.Reader)) (*process, error) {
	p := &process{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout = stdout
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var pipe io.ReadCloser
	if stderr != nil {
		var err error
		if pipe, err = p.cmd.StderrPipe(); err != nil {
			return nil, fmt.Errorf("%s stderr: %w", name, err)
		}
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	drained := make(chan struct{})
	go func() {
		if pipe != nil {
			stderr(pipe)
		}
		close(drained)
	}()
	go func() {
		<-drained // Wait closes the pipe: read it to the end first
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to timeout for the process to end by itself.
func (p *process) wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		return fmt.Errorf("%s still running after %v", p.name, timeout)
	}
}

// stop sends SIGTERM to the process group, waits up to grace, then kills
// it. It returns the exit status when the process left by itself on SIGTERM
// (nil for a clean exit), and an error when it had to be killed.
func (p *process) stop(grace time.Duration) error {
	if p.exited() {
		return p.err
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
		var ee *exec.ExitError
		if errors.As(p.err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGTERM {
			return nil
		}
		return p.err
	case <-time.After(grace):
	}
	p.kill()
	return fmt.Errorf("%s did not stop within %v of SIGTERM: killed", p.name, grace)
}

// kill ends the process group at once and waits for the exit.
func (p *process) kill() {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// tailFile returns the last n lines of a file, for failure reports.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return tailLines(string(b), n)
}

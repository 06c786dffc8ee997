package callers

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Result is a finished launch.
type Result struct {
	Code           int
	Stdout, Stderr string
	Took           time.Duration
}

// PasstLink makes dir/passt a symlink to bin, as a passt installed first in
// a management stack's PATH, and returns its path.
func PasstLink(dir, bin string) (string, error) {
	link := filepath.Join(dir, "passt")
	if err := os.Symlink(bin, link); err != nil {
		return "", err
	}
	return link, nil
}

// Launch runs argv (argv[0] as the caller spells it, "passt") from the
// program at path, with extra descriptors from 3 on and env added to the
// environment, and waits for it to exit with its output read to the end,
// as libvirt and QEMU do; a process still running (or holding its output
// open) after timeout is killed and reported.
func Launch(path string, argv []string, extra []*os.File, env []string, timeout time.Duration) (Result, error) {
	cmd := &exec.Cmd{Path: path, Args: argv, ExtraFiles: extra, Env: append(os.Environ(), env...)}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Result{}, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		return Result{}, fmt.Errorf("%s did not return within %v (stderr: %q)", strings.Join(argv, " "), timeout, errb.String())
	}
	return Result{Code: cmd.ProcessState.ExitCode(), Stdout: out.String(), Stderr: errb.String(), Took: time.Since(start)}, nil
}

// ReadPID reads a pid file as QEMU does (a positive decimal number) and
// checks that the process lives.
func ReadPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %s holds %q", path, b)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
		return 0, fmt.Errorf("pid %d from %s: not running", pid, path)
	}
	return pid, nil
}

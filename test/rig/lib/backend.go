package rig

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

var vunetBuild struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// VunetBinary returns the vunet binary the default back-end runs:
// $VUNET_RIG_BIN if set, else ./cmd/vunet of this module built once per
// process into a temporary directory (removed by Cleanup).
func VunetBinary() (string, error) {
	if p := os.Getenv("VUNET_RIG_BIN"); p != "" {
		return p, nil
	}
	b := &vunetBuild
	b.once.Do(func() {
		root, err := moduleRoot()
		if err != nil {
			b.err = err
			return
		}
		if b.dir, b.err = os.MkdirTemp("", fmt.Sprintf("%s%d-bin-", namePrefix, os.Getpid())); b.err != nil {
			return
		}
		b.bin = filepath.Join(b.dir, "vunet")
		cmd := exec.Command("go", "build", "-o", b.bin, "./cmd/vunet")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build ./cmd/vunet: %w\n%s", err, out)
		}
	})
	return b.bin, b.err
}

// moduleRoot finds vunet's source tree: the current module when run inside
// it, else the tree this file was compiled from (a CLI binary run from
// elsewhere).
func moduleRoot() (string, error) {
	if out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output(); err == nil {
		if root := strings.TrimSpace(string(out)); root != "" {
			if _, err := os.Stat(filepath.Join(root, "cmd", "vunet")); err == nil {
				return root, nil
			}
		}
	}
	_, file, _, ok := runtime.Caller(0)
	if ok {
		dir := filepath.Dir(file)
		for d := dir; d != filepath.Dir(d); d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				return d, nil
			}
		}
	}
	return "", fmt.Errorf("cannot find vunet's source tree to build ./cmd/vunet (run inside it, or set VUNET_RIG_BIN)")
}

// Cleanup removes the vunet binary VunetBinary built. Call it once at the
// end of the process (TestMain, the CLI).
func Cleanup() {
	if vunetBuild.dir != "" {
		os.RemoveAll(vunetBuild.dir)
	}
}

// expand replaces the placeholders of the back-end template.
func expand(tmpl []string, vars map[string]string) []string {
	out := make([]string, len(tmpl))
	for i, a := range tmpl {
		for k, v := range vars {
			a = strings.ReplaceAll(a, "{"+k+"}", v)
		}
		out[i] = a
	}
	return out
}

// proc is a child process the rig owns: killed (whole process group) on
// Close, and by the kernel if the rig dies first (Pdeathsig).
type proc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
	output *os.File
}

// startProc starts argv inside namespace ns ("" = the rig's own) with
// stdout and stderr appended to logPath (or inherited when logPath is "").
func startProc(ns string, argv []string, env []string, logPath string) (*proc, error) {
	if len(argv) == 0 {
		return nil, errors.New("empty command")
	}
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	// A process group of its own: Ctrl-C in the terminal goes to the rig,
	// which then tears down in order, and Close kills the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	if logPath != "" {
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr, p.output = f, f, f
	} else {
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	}
	if err := spawn(cmd); err != nil {
		if p.output != nil {
			p.output.Close()
		}
		return nil, fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	go func() {
		p.err = cmd.Wait()
		if p.output != nil {
			p.output.Close()
		}
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop waits up to grace for the process to exit on its own, then sends
// SIGTERM to its group, then SIGKILL.
func (p *proc) stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(grace):
	}
	syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
		return fmt.Errorf("needed SIGTERM: %v", p.err)
	case <-time.After(3 * time.Second):
	}
	syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("needed SIGKILL: %v", p.err)
}

// spawner starts children from one OS thread that never exits. Pdeathsig
// fires when the *thread* that forked the child exits, not the process: a
// child started from an ordinary goroutine would be killed as soon as the
// runtime retired that thread, which it does whenever a goroutine that
// locked it (inNetns) ends.
var spawner struct {
	once sync.Once
	reqs chan spawnReq
}

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func spawn(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: this thread lives as long as the process
			for r := range spawner.reqs {
				r.err <- r.cmd.Start()
			}
		}()
	})
	errc := make(chan error, 1)
	spawner.reqs <- spawnReq{cmd, errc}
	return <-errc
}

// kill ends the process group at once.
func (p *proc) kill() {
	if p.exited() {
		return
	}
	syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
}

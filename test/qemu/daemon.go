package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"vunet/test/guest/initramfs"
)

var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// DaemonBinary returns the vunet binary for this test binary: VUNET_E2E_BIN
// if set, else ./cmd/vunet built once (go build caches the compile, so this
// is cheap after the first run). A build failure fails the test: it is our
// code, not a missing prerequisite.
func DaemonBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("VUNET_E2E_BIN"); p != "" {
		return p
	}
	build.once.Do(func() {
		root, err := initramfs.ModuleRoot()
		if err != nil {
			build.err = err
			return
		}
		build.dir, build.err = os.MkdirTemp("", "vunet-e2e-bin-")
		if build.err != nil {
			return
		}
		// A daemon started as another user (DaemonConfig.Wrapper) must
		// reach the binary.
		if build.err = os.Chmod(build.dir, 0o755); build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "vunet")
		cmd := exec.Command("go", "build", "-o", build.bin, "./cmd/vunet")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build ./cmd/vunet: %w\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

// RunMain runs the package's tests and removes what DaemonBinary built. Use
// it from TestMain: os.Exit(qemu.RunMain(m)).
func RunMain(m *testing.M) int {
	code := m.Run()
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
	return code
}

// DaemonConfig describes one daemon process.
type DaemonConfig struct {
	// Connect makes the daemon dial this socket (--connect: the front-end is
	// the server). Empty: the daemon listens (--socket) on Daemon.Socket.
	Connect string
	// Args are extra flags, after the socket and logging flags.
	Args []string
	// Dir holds the socket and the log; default WorkDir(t).
	Dir string
	// Socket overrides the listening socket's path (default Dir/vhost.sock),
	// e.g. for a daemon restarted on its predecessor's socket.
	Socket string
	// Name names the log file, Dir/<Name>.log (default "daemon"), so a test
	// can run several daemons one after the other.
	Name string
	// Metrics serves Prometheus metrics on a free loopback port
	// (--metrics 127.0.0.1:0); Daemon.MetricsAddr says where. With NetNS
	// the endpoint is inside the namespace (use NetNS.Do to reach it).
	Metrics bool
	// NetNS runs the daemon inside this namespace (see NewNetNS).
	NetNS *NetNS
	// Wrapper is a command prefix the daemon runs under (inside NetNS),
	// such as setpriv to start it unprivileged.
	Wrapper []string
}

// Daemon is a running back-end process, stopped by t.Cleanup.
type Daemon struct {
	Socket  string   // the vhost-user socket (listened on or dialled)
	LogPath string   // copy of the log on disk
	Log     *LogSink // parsed log lines
	Passt   bool     // the stand-in is passt (VUNET_E2E_PASST): vunet's log lines are absent
	// MetricsAddr is host:port of the metrics endpoint (DaemonConfig.Metrics).
	MetricsAddr string

	netns   *NetNS
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error
	killed  bool // by Kill: its exit status says nothing about the daemon
}

// StartDaemon starts the back-end with debug JSON logs and, in server mode,
// waits until its socket accepts connections.
//
// VUNET_E2E_PASST=/path/to/passt runs passt --vhost-user instead, as a
// reference back-end to check the harness itself against; tests must then
// skip assertions on vunet's own log lines (Daemon.Passt).
//
// VUNET_E2E_PCAP=1 makes vunet capture the guest's frames to
// <Dir>/<Name>.pcap (with VUNET_E2E_KEEP=1 it stays after the test).
func StartDaemon(t testing.TB, cfg DaemonConfig) *Daemon {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = WorkDir(t)
	}
	if cfg.Name == "" {
		cfg.Name = "daemon"
	}
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(cfg.Dir, "vhost.sock")
	}
	d := &Daemon{Log: NewLogSink(), LogPath: filepath.Join(cfg.Dir, cfg.Name+".log"), exited: make(chan struct{}), netns: cfg.NetNS}
	var args []string
	bin := ""
	if p := os.Getenv("VUNET_E2E_PASST"); p != "" {
		if cfg.Connect != "" {
			t.Skip("passt stand-in has no client mode")
		}
		d.Passt, bin = true, p
		d.Socket = cfg.Socket
		args = []string{"--vhost-user", "-s", d.Socket, "-f", "-d", "-1"}
	} else {
		bin = DaemonBinary(t)
		args = []string{"-d", "--log-format", "json"}
		if cfg.Connect != "" {
			d.Socket = cfg.Connect
			args = append(args, "--connect", cfg.Connect)
		} else {
			d.Socket = cfg.Socket
			args = append(args, "--socket", d.Socket)
		}
		if cfg.Metrics {
			args = append(args, "--metrics", "127.0.0.1:0")
		}
		if os.Getenv("VUNET_E2E_PCAP") != "" {
			// A capture of the guest's side of the link, for a failure
			// that needs the frames' order (keep it with VUNET_E2E_KEEP).
			args = append(args, "--pcap", filepath.Join(cfg.Dir, cfg.Name+".pcap"))
		}
	}
	args = append(args, cfg.Args...)
	logFile, err := os.Create(d.LogPath)
	if err != nil {
		t.Fatalf("daemon log: %v", err)
	}
	argv := append(append(append([]string(nil), cfg.Wrapper...), bin), args...)
	if cfg.NetNS != nil {
		argv = cfg.NetNS.Command(argv...)
	}
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stdout = logFile
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatalf("daemon stderr: %v", err)
	}
	// Own process group, so cleanup reaches anything it forks.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Logf("daemon: %v (pid %d)", argv, d.cmd.Process.Pid)
	logDone := make(chan struct{})
	go func() {
		d.Log.Consume(stderr, logFile)
		close(logDone)
	}()
	go func() {
		<-logDone // Wait closes the pipe; read it to the end first
		d.exitErr = d.cmd.Wait()
		logFile.Close()
		close(d.exited)
	}()
	t.Cleanup(func() {
		if t.Failed() && d.MetricsAddr != "" {
			// What the daemon counted (frames each way, kicks,
			// interrupts sent and suppressed, service replies, leases)
			// tells a guest that got nothing from a daemon that sent
			// nothing: scraped before the daemon stops.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			m, err := d.Scrape(ctx)
			cancel()
			if err != nil {
				t.Logf("%s metrics: %v", cfg.Name, err)
			} else {
				t.Logf("%s metrics at the failure, those not zero:\n%s", cfg.Name, m.NonZero())
			}
		}
		// A daemon that crashed, or does not leave cleanly on SIGTERM, fails
		// the test even when every guest check passed.
		if err := d.Stop(5 * time.Second); err != nil && !d.killed && !d.Passt {
			t.Errorf("%s: %v", cfg.Name, err)
		}
		if !d.Passt {
			checkSandbox(t, cfg.Name, d.Log)
		}
		if t.Failed() {
			t.Logf("%s log tail (%s):\n%s", cfg.Name, d.LogPath, d.Log.Tail(60))
		}
	})
	if cfg.Metrics && !d.Passt {
		l, err := d.Log.Wait(10*time.Second, "metrics address", MsgIs("metrics listening"))
		if err != nil {
			t.Fatalf("daemon metrics: %v", err)
		}
		d.MetricsAddr = l.Attr("addr")
	}
	if cfg.Connect == "" {
		if err := waitSocket(d.Socket, d.exited, 10*time.Second); err != nil {
			t.Fatalf("daemon socket: %v\nlog:\n%s", err, d.Log.Tail(30))
		}
	}
	return d
}

// checkSandbox fails the test unless the daemon ran sandboxed (the
// default: no suite may turn it off) and its seccomp allow-list refused
// nothing: a refusal means a feature the test used needs a system call
// the list lacks.
func checkSandbox(t testing.TB, name string, log *LogSink) {
	t.Helper()
	if len(log.Match(MsgIs("sandbox applied"))) == 0 && len(log.Match(MsgIs("sandbox applied in part"))) == 0 {
		if len(log.Match(MsgIs("vunet starting"))) > 0 {
			t.Errorf("%s ran without the sandbox (no \"sandbox applied\" line)", name)
		}
	}
	for _, l := range log.Match(MsgIs(SandboxRefusal)) {
		t.Errorf("%s: the sandbox refused system call %s (add it to cmd/vunet/isolation's allow-list if vunet needs it)", name, l.Attr("syscall"))
	}
}

// SandboxRefusal is the daemon's log message when its seccomp allow-list
// refuses a system call.
const SandboxRefusal = "sandbox refused a system call"

// waitSocket waits for path to appear as a socket (the daemon listens before
// it creates nothing else, so existence means connectable).
func waitSocket(path string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if st, err := os.Stat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			return nil
		}
		select {
		case <-exited:
			return errors.New("daemon exited before listening")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v", path, timeout)
		}
	}
}

// Exited is closed when the process has exited.
func (d *Daemon) Exited() <-chan struct{} { return d.exited }

// ExitErr is the process's exit status; valid after Exited is closed.
func (d *Daemon) ExitErr() error { return d.exitErr }

// Pid is the daemon's process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// WaitExit waits up to timeout for the process to exit by itself.
func (d *Daemon) WaitExit(timeout time.Duration) error {
	select {
	case <-d.exited:
		return d.exitErr
	case <-time.After(timeout):
		return fmt.Errorf("daemon still running after %v", timeout)
	}
}

// Kill kills the process group at once, as a crash would end it, and waits
// for the exit.
func (d *Daemon) Kill() {
	d.killed = true
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.exited
}

// Stop sends SIGTERM, waits up to grace, then kills the process group.
// It returns the exit status (nil for a clean exit on SIGTERM).
func (d *Daemon) Stop(grace time.Duration) error {
	select {
	case <-d.exited:
		return d.exitErr
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return d.exitErr
	case <-time.After(grace):
	}
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.exited
	return fmt.Errorf("daemon ignored SIGTERM for %v and was killed", grace)
}

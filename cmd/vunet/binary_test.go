package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"vunet/test/testenv"
	"vunet/vhostuser"
)

// Tests that run the built vunet binary: signals, pid and socket files,
// and real QEMU and libvirt tools against its helpers' output.

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// vunetBinary builds the command once per test binary run.
func vunetBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "vunet-bin")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "vunet")
		out, err := exec.Command("go", "build", "-o", buildPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// daemon is a running vunet process whose JSON log lines are collected.
type daemon struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []map[string]any
	raw   bytes.Buffer
	done  chan struct{}
	err   error
}

func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	return startWrapped(t, nil, args...)
}

// startWrapped starts vunet under a wrapper command (such as unshare).
func startWrapped(t *testing.T, wrapper []string, args ...string) *daemon {
	t.Helper()
	return startBinary(t, wrapper, vunetBinary(t), args...)
}

// startWith starts a vunet binary other than the default build.
func startWith(t *testing.T, bin string, args ...string) *daemon {
	t.Helper()
	return startBinary(t, nil, bin, args...)
}

func startBinary(t *testing.T, wrapper []string, bin string, args ...string) *daemon {
	t.Helper()
	argv := append(append(append([]string(nil), wrapper...), bin, "--log-format", "json"), args...)
	return startCmd(t, exec.Command(argv[0], argv[1:]...), nil)
}

// startCmd starts a vunet command line (JSON logs on standard error) with
// extra environment.
func startCmd(t *testing.T, cmd *exec.Cmd, env []string) *daemon {
	t.Helper()
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			_ = json.Unmarshal(sc.Bytes(), &m)
			d.mu.Lock()
			d.raw.Write(sc.Bytes())
			d.raw.WriteByte('\n')
			if m != nil {
				d.lines = append(d.lines, m)
			}
			d.mu.Unlock()
		}
		d.err = cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			t.Logf("vunet log:\n%s", d.log())
		}
	})
	return d
}

func (d *daemon) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.raw.String()
}

// requests counts the vhost-user requests logged (debug level).
func (d *daemon) requests() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := map[string]int{}
	for _, l := range d.lines {
		if l["msg"] == "vhost-user request" {
			// The JSON handler writes the request as its number.
			switch r := l["request"].(type) {
			case string:
				m[r]++
			case float64:
				m[vhostuser.Request(r).String()]++
			}
		}
	}
	return m
}

// waitMsg waits for a log line with msg and returns it.
func (d *daemon) waitMsg(t *testing.T, msg string, timeout time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		d.mu.Lock()
		for _, l := range d.lines {
			if l["msg"] == msg {
				d.mu.Unlock()
				return l
			}
		}
		d.mu.Unlock()
		select {
		case <-d.done:
			t.Fatalf("vunet exited (%v) before logging %q", d.err, msg)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no %q log line within %v", msg, timeout)
	return nil
}

// exitCode waits for the process and returns its exit code and how long it
// took.
func (d *daemon) exitCode(t *testing.T, timeout time.Duration) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	select {
	case <-d.done:
	case <-time.After(timeout):
		t.Fatalf("vunet still running %v after the signal", timeout)
	}
	return d.cmd.ProcessState.ExitCode(), time.Since(start)
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s did not appear", path)
}

// dialUnix connects to the UNIX socket at path, retrying for 5 s while it
// refuses: the socket file appears at bind(2), before the listen(2) that
// makes it accept, so a dial right after waitFile can find nobody listening.
func dialUnix(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err == nil {
			return c
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
			t.Fatalf("connect to %s: %v", path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSignalShutdownResetsHostConnections: a host peer of a forwarded port
// sees its connection reset (RST), not closed with FIN, when vunet stops:
// the guest side is gone, and a FIN would claim an orderly end of data.
func TestSignalShutdownResetsHostConnections(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	sock := filepath.Join(dir, "v.sock")
	d := startDaemon(t, "-s", sock, "-t", fmt.Sprintf("127.0.0.1/%d:22", port))
	start := d.waitMsg(t, "vunet starting", 10*time.Second)
	if start["tcp_forwards"] != fmt.Sprintf("127.0.0.1/%d:22", port) {
		t.Errorf("start-up line forwards %v", start["tcp_forwards"])
	}
	waitFile(t, sock)
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, took := d.exitCode(t, 3*time.Second); code != 0 || took > 2*time.Second {
		t.Fatalf("exit code %d after %v", code, took)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("host peer read: %v, want connection reset", err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind (%v)", err)
	}
}

func TestSignalShutdownWithFrontEnd(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			sock, pid := filepath.Join(dir, "v.sock"), filepath.Join(dir, "v.pid")
			d := startDaemon(t, "--vhost-user", "-f", "-s", sock, "-P", pid)
			start := d.waitMsg(t, "vunet starting", 10*time.Second)
			if start["socket"] != sock || start["version"] != binaryBuildInfo(t).Version || start["mode"] != "server" {
				t.Errorf("start-up line %v", start)
			}
			waitFile(t, sock)
			b, err := os.ReadFile(pid)
			if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(d.cmd.Process.Pid) {
				t.Fatalf("pid file %q (%v), want %d", b, err, d.cmd.Process.Pid)
			}
			// A connected front-end that says nothing must not hold up
			// the shutdown; its connection is closed.
			c := dialUnix(t, sock)
			defer c.Close()
			d.waitMsg(t, "vhost-user front-end connected", 5*time.Second)

			if err := d.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			code, took := d.exitCode(t, 3*time.Second)
			if code != 0 || took > 2*time.Second {
				t.Fatalf("exit code %d after %v, want 0 within 2s", code, took)
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			if n, err := c.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("front-end connection read %d, %v after shutdown; want EOF", n, err)
			}
			for _, f := range []string{sock, pid} {
				if _, err := os.Lstat(f); !os.IsNotExist(err) {
					t.Errorf("%s left behind (%v)", f, err)
				}
			}
		})
	}
}

// needTool finds an external tool; without it the test fails in CI (with
// the Debian package to install) and is skipped elsewhere.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	return testenv.NeedTool(t, name, "", "apt-get install "+pkg)
}

// helperOutput runs a helper subcommand of the built binary.
func helperOutput(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("vunet %q: exit %d: %s", args, code, errb.String())
	}
	return out.String()
}

// splitQEMUArgs undoes qemu-args' line continuations. The test paths need
// no shell quoting.
func splitQEMUArgs(t *testing.T, s string) []string {
	t.Helper()
	var args []string
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(strings.TrimSuffix(line, " \\"))
		if len(f) != 2 {
			t.Fatalf("qemu-args line %q: want flag and value", line)
		}
		args = append(args, f...)
	}
	return args
}

// TestQEMUConnects feeds qemu-args output to a real QEMU (stopped with -S,
// no disk, no kernel) and checks it connects to a running vunet and
// completes the vhost-user negotiation of every queue pair.
func TestQEMUConnects(t *testing.T) {
	qemu := needTool(t, "qemu-system-x86_64", "qemu-system-x86")
	for _, queues := range []int{1, 2} {
		t.Run(fmt.Sprintf("queues=%d", queues), func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "v.sock")
			d := startDaemon(t, "-s", sock, "--queues", strconv.Itoa(queues), "-d")
			d.waitMsg(t, "vunet starting", 10*time.Second)
			waitFile(t, sock)

			args := splitQEMUArgs(t, helperOutput(t, "qemu-args", "-s", sock, "--queues", strconv.Itoa(queues), "--mem", "128M", "--tcg"))
			cmd := exec.Command(qemu, append([]string{"-S", "-display", "none", "-nodefaults", "-no-user-config",
				"-machine", "pc", "-accel", "tcg", "-serial", "none", "-monitor", "none"}, args...)...)
			var qout bytes.Buffer
			cmd.Stdout, cmd.Stderr = &qout, &qout
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			qdone := make(chan error, 1)
			go func() { qdone <- cmd.Wait() }()
			defer func() {
				cmd.Process.Kill()
				<-qdone
				if t.Failed() {
					t.Logf("qemu output:\n%s", qout.String())
				}
			}()
			d.waitMsg(t, "vhost-user front-end connected", 20*time.Second)
			// Under -S QEMU still negotiates at netdev set-up: the queue
			// count once, then every ring of every pair gets its call fd
			// and is enabled (FIELD-NOTES start-up order).
			want := map[string]int{"GET_QUEUE_NUM": 1, "SET_VRING_CALL": 2 * queues, "SET_VRING_ENABLE": 2 * queues}
			deadline := time.Now().Add(20 * time.Second)
			for {
				got := d.requests()
				ok := true
				for r, n := range want {
					if got[r] != n {
						ok = false
					}
				}
				if ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("vhost-user requests %v, want %v", got, want)
				}
				select {
				case err := <-qdone:
					t.Fatalf("qemu exited: %v (requests %v)", err, got)
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
	}
}

// TestQEMUAcceptsClientModeArgs: with vunet --connect, QEMU is the server
// (server=on,wait=off); QEMU must accept the arguments and listen.
func TestQEMUAcceptsClientModeArgs(t *testing.T) {
	qemu := needTool(t, "qemu-system-x86_64", "qemu-system-x86")
	dir := t.TempDir()
	sock := filepath.Join(dir, "q.sock")
	args := splitQEMUArgs(t, helperOutput(t, "qemu-args", "--connect", sock, "--mem", "64M", "--tcg"))
	cmd := exec.Command(qemu, append([]string{"-S", "-display", "none", "-nodefaults", "-no-user-config",
		"-machine", "pc", "-accel", "tcg", "-serial", "none", "-monitor", "none"}, args...)...)
	var qout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &qout, &qout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("qemu output:\n%s", qout.String())
		}
	}()
	waitFile(t, sock)
	d := startDaemon(t, "--connect", sock)
	d.waitMsg(t, "vunet starting", 10*time.Second)
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, _ := d.exitCode(t, 3*time.Second); code != 0 {
		t.Fatalf("client-mode exit code %d", code)
	}
}

// TestLibvirtXMLValidates checks libvirt-xml's output against libvirt's
// own schema, for each shape of the output.
func TestLibvirtXMLValidates(t *testing.T) {
	validate := needTool(t, "virt-xml-validate", "libvirt-clients libxml2-utils")
	needTool(t, "xmllint", "libxml2-utils")
	dir := t.TempDir()
	for name, args := range map[string][]string{
		"server":          {"-s", "/run/vunet/vm1.sock"},
		"server-tcg-mq":   {"-s", "/run/vunet/vm1.sock", "--tcg", "--queues", "4", "--guest-mac", "52:54:00:12:34:56"},
		"client":          {"--connect", "/run/vunet/q.sock"},
		"escaped-path":    {"-s", "/tmp/a'b&c<d>.sock"},
		"override-custom": {"-s", "/run/v.sock", "--tcg", "--id", "net1"},
	} {
		t.Run(name, func(t *testing.T) {
			xml := helperOutput(t, append([]string{"libvirt-xml", "--domain", "vm-" + name}, args...)...)
			f := filepath.Join(dir, name+".xml")
			if err := os.WriteFile(f, []byte(xml), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(validate, f, "domain").CombinedOutput()
			if err != nil {
				t.Fatalf("virt-xml-validate: %v\n%s\n%s", err, out, xml)
			}
		})
	}
	// The validator is not a rubber stamp: a broken interface fails.
	bad := strings.Replace(helperOutput(t, "libvirt-xml", "--domain", "bad", "-s", "/x"), "mode='client'", "mode='sideways'", 1)
	f := filepath.Join(dir, "bad.xml")
	os.WriteFile(f, []byte(bad), 0o644)
	if err := exec.Command(validate, f, "domain").Run(); err == nil {
		t.Fatal("virt-xml-validate accepted mode='sideways'")
	}
}

// TestFDOneOff: passt's --fd hands over a connected socket; vunet serves it
// and exits 0 once the peer closes it (--fd implies --one-off).
func TestFDOneOff(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours := os.NewFile(uintptr(fds[0]), "frontend")
	theirs := os.NewFile(uintptr(fds[1]), "backend")
	defer ours.Close()
	cmd := exec.Command(vunetBinary(t), "-F", "3", "--log-format", "json")
	cmd.ExtraFiles = []*os.File{theirs}
	var errb lockedBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(errb.String(), `"mode":"fd"`) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no start-up line: %s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	ours.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, errb.String())
		}
	case <-time.After(3 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("vunet --fd did not exit after the peer closed\n%s", errb.String())
	}
}

// TestRunAs drops to nobody (root only) and checks the process's IDs.
func TestRunAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o755) // t.TempDir's parent is private
	os.Chmod(dir, 0o1777)
	sock := filepath.Join(dir, "v.sock")
	d := startDaemon(t, "-s", sock, "--runas", "65534:65534")
	d.waitMsg(t, "vhost-user listening", 10*time.Second)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 5 && (f[0] == "Uid:" || f[0] == "Gid:") {
			if f[1] != "65534" || f[2] != "65534" || f[3] != "65534" || f[4] != "65534" {
				t.Errorf("%s", line)
			}
		}
	}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65534 {
		t.Errorf("socket owned by %d, want 65534", st.Uid)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	if code, _ := d.exitCode(t, 3*time.Second); code != 0 {
		t.Errorf("exit %d", code)
	}
}

// lockedBuffer is a bytes.Buffer a child process writes while a test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStartupLineLinkLocalFallback runs vunet in a fresh network namespace
// (no routes at all): the stack falls back to link-local addressing and the
// start-up line says so.
func TestStartupLineLinkLocalFallback(t *testing.T) {
	unshare, err := exec.LookPath("unshare")
	if err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and unshare")
	}
	sock := filepath.Join(t.TempDir(), "v.sock")
	d := startWrapped(t, []string{unshare, "--net"}, "-s", sock)
	l := d.waitMsg(t, "vunet starting", 10*time.Second)
	notes, _ := l["notes"].(string)
	if l["guest4"] != "169.254.2.1" || l["gateway4"] != "169.254.2.2" || l["ipv6"] != "link-local only" ||
		!strings.Contains(notes, "no default route") || !strings.Contains(notes, "link-local") {
		t.Fatalf("start-up line %v", l)
	}
	// A fresh namespace refuses ping sockets ("1 0"): said once at start.
	w := d.waitMsg(t, "guest ICMP echo will go unanswered", 5*time.Second)
	if w["family"] != "ipv4" || !strings.Contains(fmt.Sprint(w["err"]), "ping_group_range") {
		t.Fatalf("ping warning %v", w)
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	if code, _ := d.exitCode(t, 3*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestForwardFDBudget: forwards that would exhaust the open-files limit
// are refused at start-up with one line saying what to do, not half bound.
func TestForwardFDBudget(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit not found (util-linux)")
	}
	sock := filepath.Join(t.TempDir(), "v.sock")
	cmd := exec.Command(prlimit, "--nofile=5000:5000", vunetBinary(t), "-s", sock, "-t", "1000-2000")
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("exit %v: %s", err, out)
	}
	if !strings.Contains(string(out), "vunet: --tcp-ports 1000-2000: ") || !strings.Contains(string(out), "open-files limit is 5000") {
		t.Fatalf("output %s", out)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("socket created despite the error (%v)", err)
	}
}

package ops

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"vunet/test/qemu"
	"vunet/test/testenv"
)

// sessionUID runs the private session libvirtd and everything it starts:
// nobody.
const sessionUID = 65534

// privateLibvirtd is a libvirtd of the test's own, started inside the
// test's network namespace with a directory of the test's first in its
// PATH and all its state under the test's directory. It shares nothing
// with the machine's system daemon (which other tests and users may be
// running), so the PATH that decides which "passt" libvirt runs is the
// test's to set, the passt it runs lands in the namespace, and the run
// leaves nothing behind. Two kinds:
//
//   - session: qemu:///session of an unprivileged user (nobody), its
//     runtime, configuration and cache directories (XDG_*) under dir;
//     libvirt runs QEMU and passt as that user.
//   - system: qemu:///system as root, as an operator runs it, with libvirt's
//     own directories (/run/libvirt, /var/lib/libvirt, /var/cache/libvirt,
//     /var/log/libvirt, and a copy of /etc/libvirt) bind-mounted from dir
//     in the mount namespace `ip netns exec` gives it; libvirt runs QEMU
//     and passt as qemu.conf's user (libvirt-qemu on Debian).
type privateLibvirtd struct {
	System   bool
	URI      string // qemu+unix:///…?socket=… for virsh as root
	PasstDir string // libvirt's passt state directory: passt's socket and pid file
	LogDir   string // the domains' logs
	virsh    string
	log      string
	cmd      *exec.Cmd
	exited   chan struct{}
}

// startPrivateLibvirtd starts a session (system false) or system libvirtd
// in ns with its state under dir and pathFirst first in its PATH, and
// waits until virsh gets an answer. A session daemon's dir is chowned to
// nobody. t.Cleanup stops the daemon, by its pid.
func startPrivateLibvirtd(t *testing.T, ns *qemu.NetNS, dir, pathFirst string, system bool) *privateLibvirtd {
	t.Helper()
	virsh := testenv.NeedTool(t, "virsh", "", libvirtHint)
	libvirtd := testenv.NeedTool(t, "libvirtd", "", libvirtHint)
	ip := testenv.NeedTool(t, "ip", "", "apt-get install iproute2")
	s := &privateLibvirtd{System: system, virsh: virsh, log: filepath.Join(dir, "libvirtd.log"), exited: make(chan struct{})}
	path := "PATH=" + pathFirst + ":" + os.Getenv("PATH")
	var argv []string
	if system {
		argv = s.systemCommand(t, ns, dir, path, libvirtd)
	} else {
		argv = s.sessionCommand(t, ns, dir, path, libvirtd)
	}
	logf, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	s.cmd = exec.Command(ip, argv[1:]...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", strings.Join(argv, " "), err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() { s.stop(t) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := s.virshRun(ctx, "version")
		cancel()
		if err == nil {
			t.Logf("private libvirtd (pid %d, %s, PATH %s first): %s", s.cmd.Process.Pid, s.URI, pathFirst,
				strings.Join(strings.Fields(out), " "))
			return s
		}
		select {
		case <-s.exited:
			t.Fatalf("libvirtd exited at start-up (%v); its log:\n%s", s.cmd.ProcessState, tail(s.log, 30))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("libvirtd does not answer within 30s: %v; its log:\n%s", err, tail(s.log, 30))
		}
	}
}

// sessionCommand prepares dir for a session daemon and returns its
// command line.
func (s *privateLibvirtd) sessionCommand(t *testing.T, ns *qemu.NetNS, dir, path, libvirtd string) []string {
	t.Helper()
	setpriv := testenv.NeedTool(t, "setpriv", "", "apt-get install util-linux")
	home, runtime, config, cache := filepath.Join(dir, "home"), filepath.Join(dir, "run"), filepath.Join(dir, "config"), filepath.Join(dir, "cache")
	for _, d := range []string{home, runtime, cache, filepath.Join(config, "libvirt")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// stdio_handler "file": QEMU's output goes to the domain log directly.
	// The default ("logd") makes the session daemon spawn a virtlogd of its
	// own, which would outlive it.
	if err := os.WriteFile(filepath.Join(config, "libvirt", "qemu.conf"), []byte("stdio_handler = \"file\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, sessionUID, sessionUID)
	}); err != nil {
		t.Fatal(err)
	}
	s.URI = "qemu+unix:///session?socket=" + filepath.Join(runtime, "libvirt", "libvirt-sock")
	s.PasstDir = filepath.Join(runtime, "libvirt", "qemu", "run", "passt")
	s.LogDir = filepath.Join(cache, "libvirt", "qemu", "log")
	// env -i: nothing of the test's environment but PATH reaches the daemon
	// (a root HOME or XDG_* would send the session's state elsewhere).
	return ns.Command(setpriv, "--reuid="+strconv.Itoa(sessionUID), "--regid="+strconv.Itoa(sessionUID),
		"--clear-groups", "--inh-caps=-all", "env", "-i",
		"HOME="+home, "XDG_RUNTIME_DIR="+runtime, "XDG_CONFIG_HOME="+config, "XDG_CACHE_HOME="+cache,
		path, libvirtd)
}

// systemCommand prepares dir for a system daemon and returns its command
// line: a shell that bind-mounts libvirt's directories from dir (in the
// mount namespace of `ip netns exec`, private to the daemon) and execs
// libvirtd with its pid file in dir (/run/libvirtd.pid is the machine
// daemon's).
func (s *privateLibvirtd) systemCommand(t *testing.T, ns *qemu.NetNS, dir, path, libvirtd string) []string {
	t.Helper()
	etc := filepath.Join(dir, "etc")
	if out, err := exec.Command("cp", "-a", "/etc/libvirt", etc).CombinedOutput(); err != nil {
		t.Fatalf("copy /etc/libvirt: %v\n%s", err, out)
	}
	// No default network (a bridge and dnsmasq the test does not need), and
	// no virtlogd (the machine's is not reachable from the private
	// /run/libvirt): QEMU's output goes to the domain log directly.
	autostart, _ := filepath.Glob(filepath.Join(etc, "qemu", "networks", "autostart", "*"))
	for _, a := range autostart {
		if err := os.Remove(a); err != nil {
			t.Fatal(err)
		}
	}
	conf, err := os.OpenFile(filepath.Join(etc, "qemu.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conf.WriteString("\n# vunet test: no virtlogd\nstdio_handler = \"file\"\n")
	if cerr := conf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	script := []string{"set -e", "mkdir -p /run/libvirt"}
	for _, m := range []struct{ from, over string }{
		{"run", "/run/libvirt"}, {"lib", "/var/lib/libvirt"}, {"cache", "/var/cache/libvirt"},
		{"log", "/var/log/libvirt"}, {"etc", "/etc/libvirt"},
	} {
		from := filepath.Join(dir, m.from)
		if err := os.MkdirAll(from, 0o755); err != nil {
			t.Fatal(err)
		}
		script = append(script, fmt.Sprintf("mount --bind '%s' '%s'", from, m.over))
	}
	script = append(script, fmt.Sprintf("exec env -i '%s' '%s' --pid-file '%s'", path, libvirtd, filepath.Join(dir, "libvirtd.pid")))
	s.URI = "qemu+unix:///system?socket=" + filepath.Join(dir, "run", "libvirt-sock")
	s.PasstDir = filepath.Join(dir, "run", "qemu", "passt")
	s.LogDir = filepath.Join(dir, "log", "qemu")
	return ns.Command("sh", "-c", strings.Join(script, "\n"))
}

// virshRun runs one virsh command against the private daemon.
func (s *privateLibvirtd) virshRun(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, s.virsh, append([]string{"-c", s.URI}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// domainLog is where the daemon keeps a domain's QEMU command line, the
// passt command line it ran, and QEMU's stderr.
func (s *privateLibvirtd) domainLog(name string) string {
	return filepath.Join(s.LogDir, name+".log")
}

// stop ends the daemon (SIGTERM, SIGKILL after 10 s). libvirtd leaves
// running domains running: the tests destroy theirs first.
func (s *privateLibvirtd) stop(t *testing.T) {
	select {
	case <-s.exited:
		t.Errorf("libvirtd had exited before the test stopped it (%v); its log:\n%s", s.cmd.ProcessState, tail(s.log, 30))
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		t.Logf("libvirtd (pid %d) ignored SIGTERM for 10s: killed", s.cmd.Process.Pid)
	}
	if t.Failed() {
		t.Logf("libvirtd's log (%s):\n%s", s.log, tail(s.log, 40))
	}
}

// libvirtdVersion is the installed libvirtd's version, from
// `libvirtd --version` ("libvirtd (libvirt) 11.3.0").
func libvirtdVersion(t *testing.T) (major, minor int, text string) {
	t.Helper()
	libvirtd := testenv.NeedTool(t, "libvirtd", "", libvirtHint)
	out, err := exec.Command(libvirtd, "--version").Output()
	if err != nil {
		t.Fatalf("libvirtd --version: %v", err)
	}
	text = string(bytes.TrimSpace(out))
	f := strings.Fields(text)
	if len(f) == 0 {
		t.Fatalf("libvirtd --version printed nothing")
	}
	parts := strings.SplitN(f[len(f)-1], ".", 3)
	if len(parts) < 2 {
		t.Fatalf("libvirtd --version: no version in %q", text)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		t.Fatalf("libvirtd --version: no version in %q", text)
	}
	return major, minor, text
}

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

// sessionUID runs the private libvirtd and everything it starts: nobody.
const sessionUID = 65534

// sessionLibvirtd is a libvirtd of the test's own: qemu:///session of an
// unprivileged user (nobody), started inside the test's network namespace
// with its runtime, configuration and cache directories under the test's
// directory and a directory of the test's first in its PATH. It shares
// nothing with the machine's system daemon (qemu:///system, which other
// tests and users may be running), so the PATH that decides which "passt"
// libvirt runs is the test's to set, the passt it runs lands in the
// namespace, and the run leaves nothing behind.
type sessionLibvirtd struct {
	URI     string // qemu+unix:///session?socket=… for virsh as root
	Runtime string // XDG_RUNTIME_DIR: passt's socket and pid file under libvirt/qemu/run/passt
	Cache   string // XDG_CACHE_HOME: the domains' logs under libvirt/qemu/log
	virsh   string
	log     string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// startSessionLibvirtd starts libvirtd as nobody in ns with state under
// dir (which it chowns to nobody) and pathFirst first in its PATH, and
// waits until virsh gets an answer. t.Cleanup stops it, by its pid.
func startSessionLibvirtd(t *testing.T, ns *qemu.NetNS, dir, pathFirst string) *sessionLibvirtd {
	t.Helper()
	virsh := testenv.NeedTool(t, "virsh", "", libvirtHint)
	libvirtd := testenv.NeedTool(t, "libvirtd", "", libvirtHint)
	setpriv := testenv.NeedTool(t, "setpriv", "", "apt-get install util-linux")
	ip := testenv.NeedTool(t, "ip", "", "apt-get install iproute2")
	s := &sessionLibvirtd{
		Runtime: filepath.Join(dir, "run"), Cache: filepath.Join(dir, "cache"),
		virsh: virsh, log: filepath.Join(dir, "libvirtd.log"), exited: make(chan struct{}),
	}
	home, config := filepath.Join(dir, "home"), filepath.Join(dir, "config")
	for _, d := range []string{home, s.Runtime, s.Cache, filepath.Join(config, "libvirt")} {
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
	logf, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// env -i: nothing of the test's environment but PATH reaches the daemon
	// (a root HOME or XDG_* would send the session's state elsewhere).
	argv := ns.Command(setpriv, "--reuid="+strconv.Itoa(sessionUID), "--regid="+strconv.Itoa(sessionUID),
		"--clear-groups", "--inh-caps=-all", "env", "-i",
		"HOME="+home, "XDG_RUNTIME_DIR="+s.Runtime, "XDG_CONFIG_HOME="+config, "XDG_CACHE_HOME="+s.Cache,
		"PATH="+pathFirst+":"+os.Getenv("PATH"), libvirtd)
	s.cmd = exec.Command(ip, argv[1:]...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", strings.Join(argv, " "), err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() { s.stop(t) })
	s.URI = "qemu+unix:///session?socket=" + filepath.Join(s.Runtime, "libvirt", "libvirt-sock")
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := s.virshRun(ctx, "version")
		cancel()
		if err == nil {
			t.Logf("private libvirtd (pid %d, uid %d, PATH %s first): %s", s.cmd.Process.Pid, sessionUID, pathFirst,
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

// virshRun runs one virsh command against the private daemon.
func (s *sessionLibvirtd) virshRun(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, s.virsh, append([]string{"-c", s.URI}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// domainLog is where the daemon keeps a domain's QEMU command line, the
// passt command line it ran, and QEMU's stderr.
func (s *sessionLibvirtd) domainLog(name string) string {
	return filepath.Join(s.Cache, "libvirt", "qemu", "log", name+".log")
}

// stop ends the daemon (SIGTERM, SIGKILL after 10 s). A session daemon
// leaves running domains running: the tests destroy theirs first.
func (s *sessionLibvirtd) stop(t *testing.T) {
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

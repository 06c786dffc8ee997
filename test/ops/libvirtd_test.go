package ops

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"vunet/test/testenv"
)

const (
	libvirtHint = "apt-get install libvirt-daemon-system libvirt-clients"
	libvirtURI  = "qemu:///system"
)

// needLibvirtd makes sure libvirtd (and virtlogd, which writes domain logs
// and file consoles for it) answer on qemu:///system, starting them as
// daemons when they are not running — these machines have no systemd to do
// it. Daemons the test started are stopped again, by the pids they wrote,
// in t.Cleanup; running ones are left alone. It returns the virsh binary.
func needLibvirtd(t *testing.T) string {
	t.Helper()
	virsh := testenv.NeedTool(t, "virsh", "", libvirtHint)
	if virshOK(virsh) {
		return virsh
	}
	for _, d := range []struct{ name, pidfile string }{
		{"virtlogd", "/run/virtlogd.pid"},
		{"libvirtd", "/run/libvirtd.pid"},
	} {
		if pid := pidAlive(d.pidfile); pid > 0 {
			continue
		}
		bin := testenv.NeedTool(t, d.name, "", libvirtHint)
		if out, err := exec.Command(bin, "-d").CombinedOutput(); err != nil {
			t.Fatalf("%s -d: %v\n%s", d.name, err, out)
		}
		pid := waitPidfile(d.pidfile, 10*time.Second)
		if pid <= 0 {
			t.Fatalf("%s -d started but wrote no live pid to %s", d.name, d.pidfile)
		}
		t.Logf("started %s -d (pid %d)", d.name, pid)
		name, pidfile := d.name, d.pidfile
		t.Cleanup(func() { stopDaemon(t, name, pidfile, pid) })
	}
	deadline := time.Now().Add(30 * time.Second)
	for !virshOK(virsh) {
		if time.Now().After(deadline) {
			out, _ := exec.Command(virsh, "-c", libvirtURI, "version").CombinedOutput()
			t.Fatalf("libvirtd started but virsh -c %s cannot connect within 30s:\n%s", libvirtURI, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return virsh
}

// virshOK reports whether libvirtd answers.
func virshOK(virsh string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, virsh, "-c", libvirtURI, "version").Run() == nil
}

// pidAlive returns the pid in pidfile when that process exists, else 0.
func pidAlive(pidfile string) int {
	b, err := os.ReadFile(pidfile)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	if syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

func waitPidfile(pidfile string, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		if pid := pidAlive(pidfile); pid > 0 || time.Now().After(deadline) {
			return pid
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopDaemon ends a daemon the test started, by the pid it recorded, and
// waits for it to go.
func stopDaemon(t *testing.T, name, pidfile string, pid int) {
	if pidAlive(pidfile) != pid {
		return // gone, or replaced by someone else's: not ours to stop
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Logf("%s (pid %d) ignored SIGTERM for 10s: killed", name, pid)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// virshRun runs one virsh command against qemu:///system.
func virshRun(ctx context.Context, virsh string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, virsh, append([]string{"-c", libvirtURI}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

package setup

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The install lines setup.sh must produce when nothing is installed. They
// are spelled out here, not read from the script, so that a package
// dropped from a list by accident fails this test.
const (
	demoPackages = "qemu-system-x86 linux-image-amd64 busybox-static git"
	testPackages = demoPackages + " gcc libc6-dev iproute2 kmod cpio udhcpc iperf3 dpdk-dev tshark prometheus" +
		" libvirt-daemon-system libvirt-clients libxml2-utils systemd man-db zsh"
	installPrefix = "apt-get install -y -q --no-install-recommends "
)

// fakeHost is a directory of stand-ins that is the script's whole PATH:
// whatever the real machine has installed is invisible.
type fakeHost struct {
	t   *testing.T
	dir string // the PATH
	log string // every stand-in appends "NAME ARGS" here
}

// stub writes an executable bash script NAME into the fake PATH. Bash is
// named by absolute path: it is not on the fake PATH.
func (h *fakeHost) stub(name, body string) {
	h.t.Helper()
	script := "#!/bin/bash\necho \"" + name + " $*\" >>" + h.log + "\n" + body + "\n"
	if err := os.WriteFile(filepath.Join(h.dir, name), []byte(script), 0o755); err != nil {
		h.t.Fatal(err)
	}
}

// newHost makes a fake host with Go goVersion, user id uid, and the
// packages in installed known to dpkg as installed.
func newHost(t *testing.T, goVersion string, uid int, installed ...string) *fakeHost {
	t.Helper()
	h := &fakeHost{t: t, dir: t.TempDir()}
	h.log = filepath.Join(t.TempDir(), "calls")
	if goVersion != "" {
		h.stub("go", `[ "$1" = version ] && echo "go version go`+goVersion+` linux/amd64"`)
	}
	h.stub("id", `[ "$1" = -u ] && echo `+strconv.Itoa(uid))
	// dpkg-query -W -f='${Package} ${db:Status-Status}\n' PKG…: known
	// packages print a line, the rest nothing (as dpkg-query does for a
	// package it has never heard of).
	h.stub("dpkg-query", `installed=" `+strings.Join(installed, " ")+` "
shift 2
for p in "$@"; do
  case "$installed" in
    *" $p "*) echo "$p installed" ;;
    *) echo "$p not-installed" ;;
  esac
done`)
	h.stub("apt-get", "exit 0")
	return h
}

// run runs setup.sh TARGET on the fake host.
func (h *fakeHost) run(target string, env ...string) (stdout, stderr string, code int) {
	h.t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		h.t.Fatalf("bash: %v", err)
	}
	cmd := exec.Command(bash, "setup.sh", target)
	cmd.Env = append([]string{"PATH=" + h.dir, "HOME=" + h.t.TempDir()}, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		h.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// calls returns the stand-ins' invocations, in order.
func (h *fakeHost) calls() []string {
	b, err := os.ReadFile(h.log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func (h *fakeHost) called(name string) []string {
	var out []string
	for _, c := range h.calls() {
		if c == name || strings.HasPrefix(c, name+" ") {
			out = append(out, c)
		}
	}
	return out
}

func TestNotRootPrintsTheOneInstallLine(t *testing.T) {
	for _, tc := range []struct{ target, want string }{
		{"demo", demoPackages},
		{"test", testPackages},
	} {
		t.Run(tc.target, func(t *testing.T) {
			h := newHost(t, "1.26.0", 1000)
			stdout, stderr, code := h.run(tc.target)
			if code != 2 {
				t.Fatalf("exit %d, want 2\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			if want := installPrefix + tc.want + "\n"; stdout != want {
				t.Errorf("stdout:\n%q\nwant the one install line:\n%q", stdout, want)
			}
			if !strings.Contains(stderr, "missing") || !strings.Contains(stderr, "as root") {
				t.Errorf("stderr does not explain the line: %q", stderr)
			}
			if c := h.called("apt-get"); len(c) != 0 {
				t.Errorf("not root, yet apt-get ran: %q", c)
			}
			// One package query for everything, not one per package.
			if c := h.called("dpkg-query"); len(c) != 1 {
				t.Errorf("dpkg-query ran %d times, want once: %q", len(c), c)
			}
		})
	}
}

func TestRootInstallsOnlyWhatIsMissing(t *testing.T) {
	// Some installed as packages; iproute2 and prometheus stand in by
	// their commands on PATH (a tool built from source counts).
	h := newHost(t, "1.26.1", 0, "git", "gcc", "libc6-dev", "kmod", "cpio", "systemd")
	h.stub("ip", "")
	h.stub("promtool", "")
	stdout, stderr, code := h.run("test")
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	want := []string{"apt-get update -q", strings.TrimSpace(installPrefix +
		"qemu-system-x86 linux-image-amd64 busybox-static udhcpc iperf3 dpdk-dev tshark" +
		" libvirt-daemon-system libvirt-clients libxml2-utils man-db zsh")}
	if got := h.called("apt-get"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("apt-get calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestNothingMissingInstallsNothing(t *testing.T) {
	all := strings.Fields(testPackages)
	for _, target := range []string{"demo", "test"} {
		h := newHost(t, "1.27.2", 1000, all...)
		stdout, stderr, code := h.run(target)
		if code != 0 {
			t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", target, code, stdout, stderr)
		}
		if c := h.called("apt-get"); len(c) != 0 {
			t.Errorf("%s: apt-get ran with nothing missing: %q", target, c)
		}
	}
}

func TestDemoNeedsOnlyDemoPackages(t *testing.T) {
	// Everything the demo needs is there, nothing else: the demo must not
	// ask for the test suite's packages.
	h := newHost(t, "1.26.0", 1000, strings.Fields(demoPackages)...)
	if stdout, stderr, code := h.run("demo"); code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
}

func TestGoIsCheckedFirst(t *testing.T) {
	for _, tc := range []struct {
		name, goVersion string
		want            []string // in stderr
	}{
		// Debian 12's golang-go: the cryptic go.mod failure this check
		// exists for.
		{"debian-1.19", "1.19.8", []string{"Go 1.19.8", "needs Go 1.26", "https://go.dev/dl/", "1.19"}},
		{"older-minor", "1.25.9", []string{"Go 1.25.9", "needs Go 1.26"}},
		{"absent", "", []string{"'go' not found on PATH", "https://go.dev/dl/"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t, tc.goVersion, 0) // root, nothing installed
			stdout, stderr, code := h.run("test")
			if code != 1 {
				t.Fatalf("exit %d, want 1\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q: %q", w, stderr)
				}
			}
			// Go first: no package was looked at or installed.
			if c := append(h.called("dpkg-query"), h.called("apt-get")...); len(c) != 0 {
				t.Errorf("packages handled before Go was found wanting: %q", c)
			}
		})
	}
}

func TestGoFromGOVariable(t *testing.T) {
	// make passes GO=…; the script checks that toolchain, not go on PATH.
	h := newHost(t, "1.19.8", 1000, strings.Fields(testPackages)...)
	other := filepath.Join(t.TempDir(), "go-new")
	if err := os.WriteFile(other, []byte("#!/bin/bash\necho go version go1.26.3 linux/amd64\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, code := h.run("test", "GO="+other); code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
}

func TestUsage(t *testing.T) {
	h := newHost(t, "1.26.0", 1000)
	if _, stderr, code := h.run("everything"); code != 64 || !strings.Contains(stderr, "usage") {
		t.Errorf("unknown target: exit %d, stderr %q", code, stderr)
	}
}

// TestREADMEListsTheDemoPackages keeps README's demo section true: it names
// the demo's packages, exactly, in the apt-get line a user copies.
func TestREADMEListsTheDemoPackages(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*apt-get install (.*)$`).FindAllSubmatch(b, -1)
	if len(m) == 0 {
		t.Fatal("README has no `apt-get install …` line for the demo")
	}
	want := strings.Fields(demoPackages)
	got := strings.Fields(string(m[0][1]))
	var pkgs []string
	for _, f := range got {
		if !strings.HasPrefix(f, "-") {
			pkgs = append(pkgs, f)
		}
	}
	if strings.Join(pkgs, " ") != strings.Join(want, " ") {
		t.Errorf("README's first apt-get line installs %q, the demo needs %q", pkgs, want)
	}
}

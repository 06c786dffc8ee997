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
	demoPackages = "qemu-system-x86 linux-image-amd64 busybox-static git make ca-certificates"
	testPackages = demoPackages + " gcc libc6-dev iproute2 kmod cpio udhcpc iperf3 dpdk-dev tshark prometheus" +
		" libxml2-utils systemd man-db zsh"
	installPrefix = "apt-get install -y -q --no-install-recommends "
	// libvirt >= 11.1 (it runs passt), from bookworm-backports on Debian 12.
	libvirtPackages  = "libvirt-daemon-system libvirt-clients"
	backportsInstall = installPrefix + "-t bookworm-backports " + libvirtPackages
	backportsLine    = "deb http://deb.debian.org/debian bookworm-backports main"
	backportsFile    = "etc/apt/sources.list.d/vunet-bookworm-backports.list"
	libvirtBackports = "libvirt-daemon-system=11.3.0-2~bpo12+1 libvirt-clients=11.3.0-2~bpo12+1"
	libvirtDebian12  = "libvirt-daemon-system=9.0.0-4+deb12u2 libvirt-clients=9.0.0-4+deb12u2"
	// As root, apt-get waits for another apt's lock (apt-daily on a freshly
	// booted machine) instead of failing at once.
	lockWait             = "-o DPkg::Lock::Timeout=300"
	rootUpdate           = "apt-get " + lockWait + " update -q"
	rootInstall          = "apt-get " + lockWait + " install -y -q --no-install-recommends "
	rootBackportsInstall = rootInstall + "-t bookworm-backports " + libvirtPackages
)

// fakeHost is a directory of stand-ins that is the script's whole PATH:
// whatever the real machine has installed is invisible.
type fakeHost struct {
	t    *testing.T
	dir  string // the PATH
	log  string // every stand-in appends "NAME ARGS" here
	root string // VUNET_SETUP_ROOT: etc/os-release and etc/apt
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

// newHost makes a fake Debian 12 host with Go goVersion, user id uid, no
// backports source, and the packages in installed (PKG or PKG=VERSION)
// known to dpkg as installed.
func newHost(t *testing.T, goVersion string, uid int, installed ...string) *fakeHost {
	t.Helper()
	h := &fakeHost{t: t, dir: t.TempDir(), root: t.TempDir()}
	h.log = filepath.Join(t.TempDir(), "calls")
	h.file("etc/os-release", "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_ID=\"12\"\nVERSION_CODENAME=bookworm\nID=debian\n")
	h.file("etc/apt/sources.list.d/debian.sources", "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\n")
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
    *" $p="*) v=${installed#*" $p="}; echo "$p installed ${v%% *}" ;;
    *" $p "*) echo "$p installed 1.0-1" ;;
    *) echo "$p not-installed" ;;
  esac
done`)
	h.stub("apt-get", "exit 0")
	return h
}

// file writes a file under the fake root.
func (h *fakeHost) file(rel, content string) {
	h.t.Helper()
	p := filepath.Join(h.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// run runs setup.sh TARGET on the fake host.
func (h *fakeHost) run(target string, env ...string) (stdout, stderr string, code int) {
	h.t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		h.t.Fatalf("bash: %v", err)
	}
	cmd := exec.Command(bash, "setup.sh", target)
	cmd.Env = append([]string{"PATH=" + h.dir, "HOME=" + h.t.TempDir(), "VUNET_SETUP_ROOT=" + h.root}, env...)
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
		{"demo", installPrefix + demoPackages + "\n"},
		// Then libvirt from bookworm-backports: the source, and the
		// install that takes only libvirt from there, on the same line.
		{"test", installPrefix + testPackages + " && " +
			"echo '" + backportsLine + "' >/" + backportsFile + " && apt-get update -q && " +
			backportsInstall + "\n"},
	} {
		t.Run(tc.target, func(t *testing.T) {
			h := newHost(t, "1.26.0", 1000)
			stdout, stderr, code := h.run(tc.target)
			if code != 2 {
				t.Fatalf("exit %d, want 2\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			if stdout != tc.want {
				t.Errorf("stdout:\n%q\nwant the install lines:\n%q", stdout, tc.want)
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
	// libvirt at 11.3 (backports) is new enough.
	h := newHost(t, "1.26.1", 0, append([]string{"git", "gcc", "libc6-dev", "kmod", "cpio", "systemd"},
		strings.Fields(libvirtBackports)...)...)
	h.stub("ip", "")
	h.stub("promtool", "")
	stdout, stderr, code := h.run("test")
	if code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	want := []string{rootUpdate, rootInstall +
		"qemu-system-x86 linux-image-amd64 busybox-static make ca-certificates udhcpc iperf3 dpdk-dev tshark" +
		" libxml2-utils man-db zsh"}
	if got := h.called("apt-get"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("apt-get calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := os.Stat(filepath.Join(h.root, backportsFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("backports source written though libvirt is recent enough: %v", err)
	}
}

// TestLibvirtFromBackports: Debian 12's libvirt 9.0 (or none) on bookworm
// makes the script add bookworm-backports once and install libvirt with
// -t bookworm-backports after everything else, alone.
func TestLibvirtFromBackports(t *testing.T) {
	rest := strings.Fields(testPackages)
	for _, tc := range []struct {
		name          string
		installed     []string
		sourceFile    string // an existing source naming backports, if any
		sourceContent string
		addSource     bool
	}{
		{"debian-9.0", append(rest, strings.Fields(libvirtDebian12)...), "", "", true},
		{"absent", rest, "", "", true},
		{"source-deb822", rest, "etc/apt/sources.list.d/backports.sources",
			"Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\n", false},
		{"source-one-line", rest, "etc/apt/sources.list", "# old\n" + backportsLine + "\n", false},
		{"source-commented-out", rest, "etc/apt/sources.list", "# " + backportsLine + "\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t, "1.26.0", 0, tc.installed...)
			if tc.sourceFile != "" {
				h.file(tc.sourceFile, tc.sourceContent)
			}
			stdout, stderr, code := h.run("test")
			if code != 0 {
				t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			want := []string{rootUpdate, rootBackportsInstall}
			if got := h.called("apt-get"); strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("apt-get calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			b, err := os.ReadFile(filepath.Join(h.root, backportsFile))
			switch {
			case tc.addSource && string(b) != backportsLine+"\n":
				t.Errorf("%s: %q (%v), want %q", backportsFile, b, err, backportsLine+"\n")
			case !tc.addSource && !errors.Is(err, os.ErrNotExist):
				t.Errorf("a backports source exists, yet %s was written: %q", backportsFile, b)
			}
			if tc.addSource {
				// Run again, libvirt still old (say the install failed): the
				// source is not added twice, only the install repeated.
				stdout, stderr, code := h.run("test")
				if code != 0 || strings.Contains(stdout, "adding") {
					t.Errorf("second run: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
				}
				if b, _ := os.ReadFile(filepath.Join(h.root, backportsFile)); string(b) != backportsLine+"\n" {
					t.Errorf("second run: %s is %q", backportsFile, b)
				}
			}
		})
	}
}

// TestLibvirtElsewhereFromTheRelease: not on bookworm (Debian 13 has
// libvirt 11.3), libvirt is installed from the release, no backports.
func TestLibvirtElsewhereFromTheRelease(t *testing.T) {
	h := newHost(t, "1.26.0", 0, strings.Fields(testPackages)...)
	h.file("etc/os-release", "VERSION_CODENAME=trixie\nID=debian\n")
	if stdout, stderr, code := h.run("test"); code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	want := []string{rootUpdate, rootInstall + libvirtPackages}
	if got := h.called("apt-get"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("apt-get calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := os.Stat(filepath.Join(h.root, backportsFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("backports source written on trixie: %v", err)
	}
}

// TestRootInstallsWhenUpdateFails: apt-get update does not wait for the
// lists' lock another apt holds; the install goes on with the lists there
// are, and its own failure is the script's.
func TestRootInstallsWhenUpdateFails(t *testing.T) {
	for _, tc := range []struct {
		name     string
		installs bool // the stand-in install succeeds
		wantCode int
	}{{"install-succeeds", true, 0}, {"install-fails", false, 100}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t, "1.26.0", 0)
			ok := "exit 100"
			if tc.installs {
				ok = "exit 0"
			}
			h.stub("apt-get", `case " $* " in
  *" update "*) echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)" >&2; exit 100 ;;
  *" install "*) `+ok+` ;;
esac`)
			stdout, stderr, code := h.run("demo")
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.wantCode, stdout, stderr)
			}
			want := rootInstall + demoPackages
			if c := h.called("apt-get"); len(c) != 2 || c[0] != rootUpdate || c[1] != want {
				t.Errorf("apt-get calls %q, want an update then %q", c, want)
			}
			if !strings.Contains(stderr, "apt-get update failed") {
				t.Errorf("stderr does not say the update failed: %q", stderr)
			}
		})
	}
	// The backports source just added has no lists until an update: the
	// script stops rather than let apt-get install -t fail obscurely.
	t.Run("source-just-added", func(t *testing.T) {
		h := newHost(t, "1.26.0", 0, strings.Fields(testPackages)...)
		h.stub("apt-get", `case " $* " in *" update "*) exit 100 ;; esac`)
		_, stderr, code := h.run("test")
		if code != 1 || !strings.Contains(stderr, "bookworm-backports source just added needs it") {
			t.Errorf("exit %d, want 1 and why: %q", code, stderr)
		}
		if c := h.called("apt-get"); len(c) != 1 || c[0] != rootUpdate {
			t.Errorf("apt-get calls %q, want only the update", c)
		}
	})
}

func TestNothingMissingInstallsNothing(t *testing.T) {
	all := append(strings.Fields(testPackages), strings.Fields(libvirtBackports)...)
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

// TestGoLostUnderSudo: sudo resets PATH, so Go installed in the user's PATH
// is not found when a user runs `sudo make test`; the message says how to
// keep it.
func TestGoLostUnderSudo(t *testing.T) {
	h := newHost(t, "", 0)
	_, stderr, code := h.run("test", "SUDO_USER=alice")
	if code != 1 || !strings.Contains(stderr, `sudo env PATH="$PATH" make test`) {
		t.Errorf("exit %d, want 1 and how to keep PATH under sudo: %q", code, stderr)
	}
}

func TestGoFromGOVariable(t *testing.T) {
	// make passes GO=…; the script checks that toolchain, not go on PATH.
	h := newHost(t, "1.19.8", 1000, append(strings.Fields(testPackages), strings.Fields(libvirtBackports)...)...)
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

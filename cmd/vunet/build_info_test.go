package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"vunet/metrics"
)

func TestBuildInfoFrom(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "v0.0.0-20260102150405-0123456789ab+dirty"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "true"}}}
	clean := &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "fedcba"}, {Key: "vcs.modified", Value: "false"}}}
	unstamped := &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"}}
	for _, tc := range []struct {
		name string
		ld   string
		ldr  string
		bi   *debug.BuildInfo
		want metrics.BuildInfo
	}{
		{"ldflags wins", "1.2.3", "", stamped, metrics.BuildInfo{Version: "1.2.3", Revision: "0123456789abcdef+dirty", GoVersion: "go1.26.1"}},
		{"ldflags revision wins", "", "abc+dirty", stamped, metrics.BuildInfo{Version: "v0.0.0-20260102150405-0123456789ab+dirty", Revision: "abc+dirty", GoVersion: "go1.26.1"}},
		{"ldflags revision without VCS data", "", "abc", unstamped, metrics.BuildInfo{Version: "devel", Revision: "abc", GoVersion: "go1.26.1"}},
		{"module pseudo-version", "", "", stamped, metrics.BuildInfo{Version: "v0.0.0-20260102150405-0123456789ab+dirty", Revision: "0123456789abcdef+dirty", GoVersion: "go1.26.1"}},
		{"clean checkout, no version", "", "", clean, metrics.BuildInfo{Version: "devel", Revision: "fedcba", GoVersion: "go1.26.1"}},
		{"go run, no VCS data", "", "", unstamped, metrics.BuildInfo{Version: "devel", Revision: "unknown", GoVersion: "go1.26.1"}},
		{"no build info", "", "", nil, metrics.BuildInfo{Version: "devel", Revision: "unknown", GoVersion: "unknown"}},
	} {
		if got := buildInfoFrom(tc.ld, tc.ldr, tc.bi); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

var versionRE = regexp.MustCompile(`^vunet (\S+) \(revision (\S+), (go\S+)\)\n$`)

// binaryBuildInfo runs `vunet --version` on a built binary and parses it.
func binaryBuildInfo(t *testing.T, bin ...string) metrics.BuildInfo {
	t.Helper()
	path := vunetBinary(t)
	if len(bin) > 0 {
		path = bin[0]
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", path, err)
	}
	m := versionRE.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("--version printed %q", out)
	}
	return metrics.BuildInfo{Version: m[1], Revision: m[2], GoVersion: m[3]}
}

// TestVersionAndBuildInfoAgree: what was given at link time is what
// --version prints and what vunet_build_info exports.
func TestVersionAndBuildInfoAgree(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "vunet")
	if out, err := exec.Command("go", "build", "-ldflags", "-X main.version=9.8.7-test -X main.revision=0badc0de+dirty", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	info := binaryBuildInfo(t, bin)
	if info.Version != "9.8.7-test" || info.Revision != "0badc0de+dirty" || info.GoVersion != runtime.Version() {
		t.Errorf("--version says %+v", info)
	}
	d := startWith(t, bin, "--socket", filepath.Join(t.TempDir(), "v.sock"), "--metrics", "127.0.0.1:0")
	addr, _ := d.waitMsg(t, "metrics listening", 10*time.Second)["addr"].(string)
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := `vunet_build_info{goversion="` + info.GoVersion + `",revision="` + info.Revision + `",version="` + info.Version + `"} 1`
	if !bytes.Contains(body, []byte(want+"\n")) {
		t.Errorf("scrape lacks %s; build info lines:\n%s", want, grepLines(string(body), "build_info"))
	}
}

// TestVersionFromCheckout: built from a git checkout with nothing given at
// link time, the binary knows its commit (Go's VCS stamping). Go stamps
// only when .git is a directory: not in a git worktree, where .git is a
// file (CI builds a plain clone).
func TestVersionFromCheckout(t *testing.T) {
	git := needTool(t, "git", "git")
	top, err := exec.Command(git, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(strings.TrimSpace(string(top)), ".git")); err != nil || !fi.IsDir() {
		t.Skip("a git worktree (.git is a file): Go stamps no VCS data there; make build passes -ldflags instead")
	}
	head, err := exec.Command(git, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "vunet")
	// -buildvcs=true: the environment may say false (GOFLAGS).
	if out, err := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	info := binaryBuildInfo(t, bin)
	if rev := strings.TrimSuffix(info.Revision, "+dirty"); rev != strings.TrimSpace(string(head)) {
		t.Errorf("--version says revision %q, HEAD is %s", info.Revision, head)
	}
	if info.Version == "devel" || !strings.HasPrefix(info.Version, "v") {
		t.Errorf("--version says version %q for a build from a checkout, want the module's (pseudo-)version", info.Version)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

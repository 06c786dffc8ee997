// Package testenv says what a test may do when something it needs from the
// machine is missing (root, a tool, a kernel feature): skip with an install
// hint on a developer's machine, fail with the same hint in CI, so that CI
// cannot go green by skipping. Every test of the module that depends on the
// environment asks here; there is one meaning of "in CI".
//
// It is test support: any package's tests may import it, and it imports
// nothing of vunet's.
package testenv

import (
	"errors"
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run in CI: the CI environment variable is
// set to anything but "", "0" or "false" (CI systems set CI=true). Missing
// prerequisites then fail tests instead of skipping them.
func InCI() bool {
	switch os.Getenv("CI") {
	case "", "0", "false":
		return false
	}
	return true
}

// Unavailable skips t, or fails it in CI, because something the test needs
// is missing; hint says how to get it (an apt-get line, "run as root").
func Unavailable(t testing.TB, what error, hint string) {
	t.Helper()
	if InCI() {
		t.Fatalf("%v (CI is set, so this fails instead of skipping; install: %s)", what, hint)
	}
	t.Skipf("%v (install: %s)", what, hint)
}

// NeedTool returns the path of an executable on PATH (or in env, when env
// names a set variable), or skips/fails t with the install hint.
func NeedTool(t testing.TB, name, env, hint string) string {
	t.Helper()
	if env != "" {
		if p := os.Getenv(env); p != "" {
			name = p
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, err, hint)
	}
	return p
}

// NeedRoot skips or fails t when not running as root.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, errors.New("needs root: "+why), "run the test as root (sudo -E go test …)")
	}
}

// SkipIfShort skips end-to-end tests under go test -short, so that unit
// test runs over the whole module (go test -short ./...) stay fast.
func SkipIfShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: skipped with -short")
	}
}

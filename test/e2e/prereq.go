package e2e

import (
	"errors"
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the CI environment variable is set: missing
// prerequisites then fail tests instead of skipping them.
func InCI() bool { return os.Getenv("CI") != "" }

// Unavailable skips t, or fails it under CI, because something the test
// needs is missing; hint says how to install it.
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

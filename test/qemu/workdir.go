package qemu

import (
	"os"
	"sync"
	"testing"
)

var workDirs sync.Map // testing.TB -> string

// WorkDir returns the test's directory for sockets, logs and serial output;
// every helper of one test shares it. It is removed after the test unless
// VUNET_E2E_KEEP is set, in which case its path is logged so the logs can
// be read after a failure.
func WorkDir(t testing.TB) string {
	t.Helper()
	if d, ok := workDirs.Load(t); ok {
		return d.(string)
	}
	// Short base instead of t.TempDir(): UNIX socket paths must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "vunet-e2e-")
	if err != nil {
		t.Fatalf("work dir: %v", err)
	}
	workDirs.Store(t, dir)
	t.Cleanup(func() {
		workDirs.Delete(t)
		if os.Getenv("VUNET_E2E_KEEP") != "" {
			t.Logf("work dir kept: %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

package vhostuser

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestListenUnixModeFromTheStart: the socket file is never wider than the
// configured mode, not even before Serve's chmod: with a permissive umask,
// the file listenUnix creates already has the mode (a listen-then-chmod
// leaves it 0777 meanwhile). Serve's final mode is checked by
// TestServeSocketMode.
func TestListenUnixModeFromTheStart(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	for _, mode := range []os.FileMode{0o600, 0o660, 0o700} {
		t.Run(fmt.Sprintf("%#o", mode), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "vu.sock")
			l, err := listenUnix(path, mode)
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != mode {
				t.Fatalf("socket file %v right after bind, want %v", fi.Mode(), mode)
			}
			// It serves, and Close leaves the file (Serve removes its own).
			c := dial(t, path)
			if _, err := l.AcceptUnix(); err != nil {
				t.Fatal(err)
			}
			c.c.Close()
			l.Close()
			if _, err := os.Lstat(path); err != nil {
				t.Fatalf("listener unlinked the file: %v", err)
			}
		})
	}
	// A path that cannot be bound is an error, not a panic.
	if _, err := listenUnix(filepath.Join(t.TempDir(), "missing", "vu.sock"), 0o600); err == nil {
		t.Fatalf("bind into a missing directory succeeded")
	}
}

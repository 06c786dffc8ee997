package pidfile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteReplacesLinkAndStaleFile: a symbolic link at the path is
// replaced, not written through, and a stale file is replaced; no
// temporary file is left behind.
func TestWriteReplacesLinkAndStaleFile(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "vunet.pid")
	if err := os.Symlink(victim, path); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, 4242); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep me\n" {
		t.Fatalf("the link's target was written: %q", b)
	}
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Fatalf("pid file %v, %v: want a regular 0644 file", fi, err)
	}
	if b, _ := os.ReadFile(path); string(b) != "4242\n" {
		t.Fatalf("pid file holds %q", b)
	}
	if err := Write(path, 4343); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "4343\n" {
		t.Fatalf("stale pid file not replaced: %q", b)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Fatalf("directory holds %d entries, want the pid file and the victim: %v", len(entries), entries)
	}
}

// TestWriteFailsCleanly: a directory that does not exist is an error
// naming the flag.
func TestWriteFailsCleanly(t *testing.T) {
	err := Write(filepath.Join(t.TempDir(), "missing", "vunet.pid"), 1)
	if err == nil {
		t.Fatal("no error for a missing directory")
	}
}

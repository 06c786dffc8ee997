package isolation

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestHandSocketOnlyChownsSockets: the listening socket is handed to the
// dropped user by its path, as root. Whatever else that path names by
// then (a hard link to a root file planted by whoever may write the
// directory, a symbolic link) keeps its owner: only a socket is handed
// over.
func TestHandSocketOnlyChownsSockets(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root (CI runs as root)")
		}
		t.Skip("needs root")
	}
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	owner := func(p string) int {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return int(st.Uid)
	}
	hard := filepath.Join(dir, "hard.sock")
	if err := os.Link(victim, hard); err != nil {
		t.Fatal(err)
	}
	if err := handToUser(hard, 65534, 65534); err == nil {
		t.Error("a hard link to a regular file was handed over")
	}
	soft := filepath.Join(dir, "soft.sock")
	if err := os.Symlink(victim, soft); err != nil {
		t.Fatal(err)
	}
	if err := handToUser(soft, 65534, 65534); err == nil {
		t.Error("a symbolic link was handed over")
	}
	if owner(victim) != 0 || owner(soft) != 0 {
		t.Errorf("owners: file %d, link %d; want 0", owner(victim), owner(soft))
	}
	sock := filepath.Join(dir, "v.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := handToUser(sock, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if owner(sock) != 65534 {
		t.Errorf("socket owned by %d, want 65534", owner(sock))
	}
}

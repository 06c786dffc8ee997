package virtqueue

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCheckSharedFile: memory the daemon may map lives in memory or on a
// local disk; a file on a network or FUSE file system, whose page faults
// wait for a server, is refused (one that never answers would freeze
// every goroutine at the next garbage collection).
func TestCheckSharedFile(t *testing.T) {
	fd, err := unix.MemfdCreate("vunet-test-check", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := CheckSharedFile(fd); err != nil {
		t.Errorf("memfd refused: %v", err)
	}
	// A file in the test's temporary directory: accepted unless that
	// directory itself is on a remote file system.
	f, err := os.CreateTemp(t.TempDir(), "disk")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		t.Fatal(err)
	}
	_, remote := remoteFS[uint32(fs.Type)]
	if err := CheckSharedFile(int(f.Fd())); (err != nil) != remote {
		t.Errorf("a file in %s (f_type %#x): %v, want refused %v", t.TempDir(), fs.Type, err, remote)
	}
	for _, tc := range []struct {
		fsType uint32
		remote bool
	}{
		{unix.FUSE_SUPER_MAGIC, true}, {unix.NFS_SUPER_MAGIC, true}, {unix.CIFS_SUPER_MAGIC, true},
		{unix.SMB2_SUPER_MAGIC, true}, {unix.V9FS_MAGIC, true}, {unix.CEPH_SUPER_MAGIC, true},
		{unix.TMPFS_MAGIC, false}, {unix.HUGETLBFS_MAGIC, false}, {unix.EXT4_SUPER_MAGIC, false},
		{unix.XFS_SUPER_MAGIC, false}, {unix.BTRFS_SUPER_MAGIC, false},
	} {
		err := checkFSType(tc.fsType)
		if got := errors.Is(err, ErrRemoteFile); got != tc.remote {
			t.Errorf("f_type %#x: %v, want refused %v", tc.fsType, err, tc.remote)
		}
	}
	if err := CheckSharedFile(-1); err == nil || errors.Is(err, ErrRemoteFile) {
		t.Errorf("fd -1: %v, want an fstatfs error", err)
	}
}

// TestMapRefusesRemoteFile: guest memory and the dirty log are both
// checked before they are mapped: a file the (stand-in) FUSE file system
// serves is refused by MapRegion and MapDirtyLog, and nothing is mapped.
func TestMapRefusesRemoteFile(t *testing.T) {
	fd, err := unix.MemfdCreate("vunet-test-remote", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 1<<20); err != nil {
		t.Fatal(err)
	}
	old := fsTypeOf
	t.Cleanup(func() { fsTypeOf = old })
	fsTypeOf = func(int) (uint32, error) { return unix.FUSE_SUPER_MAGIC, nil }
	if r, err := MapRegion(fd, RegionSpec{GuestAddr: 0, Size: 1 << 20, UserAddr: 0x7f0000000000}); !errors.Is(err, ErrRemoteFile) {
		if r != nil {
			r.Unmap()
		}
		t.Errorf("MapRegion on FUSE: %v, want ErrRemoteFile", err)
	}
	if l, err := MapDirtyLog(fd, 4096, 0); !errors.Is(err, ErrRemoteFile) || !errors.Is(err, ErrDirtyLogFile) {
		if l != nil {
			l.Unmap()
		}
		t.Errorf("MapDirtyLog on FUSE: %v, want ErrRemoteFile and ErrDirtyLogFile", err)
	}
	fsTypeOf = old
	r, err := MapRegion(fd, RegionSpec{GuestAddr: 0, Size: 1 << 20, UserAddr: 0x7f0000000000})
	if err != nil {
		t.Fatalf("MapRegion on a memfd: %v", err)
	}
	r.Unmap()
}

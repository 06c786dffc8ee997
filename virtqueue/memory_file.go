package virtqueue

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// ErrRemoteFile is returned for a guest memory or dirty-log file on a file
// system whose pages another party serves: a network file system or a
// user-space one (FUSE).
var ErrRemoteFile = errors.New("file on a network or user-space file system")

// remoteFS names the file systems (statfs f_type, include/uapi/linux/magic.h)
// whose page faults wait for a server: NFS, SMB/CIFS, 9P, Ceph, AFS, Coda,
// or a FUSE process, which may be the front-end itself.
var remoteFS = map[uint32]string{
	unix.FUSE_SUPER_MAGIC: "fuse",
	unix.NFS_SUPER_MAGIC:  "nfs",
	unix.SMB_SUPER_MAGIC:  "smb",
	unix.SMB2_SUPER_MAGIC: "smb2",
	unix.CIFS_SUPER_MAGIC: "cifs",
	unix.V9FS_MAGIC:       "9p",
	unix.CEPH_SUPER_MAGIC: "ceph",
	unix.AFS_FS_MAGIC:     "afs",
	unix.AFS_SUPER_MAGIC:  "afs",
	unix.CODA_SUPER_MAGIC: "coda",
}

// CheckSharedFile refuses a file to be mapped as guest memory or as the
// dirty log when it lives on a remote or user-space file system. A thread
// that touches such a page sleeps in the page fault until the server
// answers, and Go cannot preempt it: it keeps its P, the next
// stop-the-world garbage collection waits for it, and with it every
// goroutine — every queue pair, every session, the stop deadline and the
// signal handling. A front-end serving its memory that way, or a server
// that hangs, would freeze the daemon. memfd, tmpfs, hugetlbfs and local
// disk file systems (libvirt's file-backed memory) are accepted.
// MapRegion and MapDirtyLog check their files with it.
func CheckSharedFile(fd int) error {
	t, err := fsTypeOf(fd)
	if err != nil {
		return fmt.Errorf("fstatfs fd %d: %w", fd, err)
	}
	return checkFSType(t)
}

// fsTypeOf is the file system type of fd's file (a variable: tests stand
// in for file systems they cannot mount).
var fsTypeOf = func(fd int) (uint32, error) {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return 0, err
	}
	return uint32(fs.Type), nil
}

func checkFSType(t uint32) error {
	if name, ok := remoteFS[t]; ok {
		return fmt.Errorf("%w (%s, f_type %#x): a page fault its server does not answer would stop the whole daemon", ErrRemoteFile, name, t)
	}
	return nil
}

package vhostuser

import (
	"fmt"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// checkEventfd refuses a kick, call or error descriptor that is not an
// eventfd. Anything else misbehaves on the data plane: a pipe whose writer
// is gone reads EOF forever (an event loop spinning on it), a full pipe or
// a FIFO blocks a write, a regular file cannot be polled.
//
// The kind of an anonymous-inode file shows only in the target of its
// /proc/self/fd link, "anon_inode:[eventfd]". /proc/self stays readable in
// the sandbox (DESIGN.md, Isolation). Without /proc the check falls back
// to what fstat can tell: an anonymous inode (the one every eventfd,
// epoll, timerfd and signalfd share), which rules out pipes, sockets,
// devices and files; the eventfd I/O in virtqueue then reports the other
// kinds as errors, never blocking on them.
func checkEventfd(fd int) error {
	var buf [64]byte
	n, err := unix.Readlink("/proc/self/fd/"+strconv.Itoa(fd), buf[:])
	if err == nil {
		if target := string(buf[:n]); target != "anon_inode:[eventfd]" {
			return fmt.Errorf("fd %d is %q, not an eventfd: %w", fd, target, ErrInvalid)
		}
		return nil
	}
	// The descriptor is ours, so its link exists wherever /proc is
	// mounted and readable: no /proc here.
	if err == unix.ENOENT || err == unix.EACCES || err == unix.EPERM {
		return checkAnonInode(fd)
	}
	return fmt.Errorf("fd %d: %w: %w", fd, ErrInvalid, err)
}

// anonInode is the device and inode that every anonymous-inode file
// shares, taken from an eventfd of our own.
var anonInode = sync.OnceValues(func() (unix.Stat_t, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return unix.Stat_t{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	return st, err
})

func checkAnonInode(fd int) error {
	ref, err := anonInode()
	if err != nil {
		return fmt.Errorf("fd %d: cannot check its type: %w", fd, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fd %d: %w: %w", fd, ErrInvalid, err)
	}
	if st.Dev != ref.Dev || st.Ino != ref.Ino {
		return fmt.Errorf("fd %d (mode %#o) is not an eventfd: %w", fd, st.Mode, ErrInvalid)
	}
	return nil
}

package testenv

import (
	"testing"

	"golang.org/x/sys/unix"
)

// LimitFDs lowers this process's soft RLIMIT_NOFILE to its lowest free
// descriptor number, so the next descriptor anything asks for (socket,
// accept, epoll_create) fails with EMFILE, as at a daemon's limit, and
// returns the function that puts the limit back (also run at cleanup).
// The whole process is limited: tests using it must not run in parallel.
func LimitFDs(t testing.TB) (restore func()) {
	t.Helper()
	free, err := unix.Dup(0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(free)
	var old unix.Rlimit
	if err := unix.Prlimit(0, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatal(err)
	}
	lim := unix.Rlimit{Cur: uint64(free), Max: old.Max}
	if err := unix.Prlimit(0, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatal(err)
	}
	done := false
	restore = func() {
		if !done {
			done = true
			if err := unix.Prlimit(0, unix.RLIMIT_NOFILE, &old, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(restore)
	return restore
}

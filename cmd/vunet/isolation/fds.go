package isolation

import (
	"os"
	"sort"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseInheritedFDs closes every descriptor this process inherited from
// whoever started it, except standard input, output and error, the ones
// in keep (--fd) and a socket-activation set (LISTEN_FDS for this
// process). A descriptor without close-on-exec is an inherited one: the
// Go runtime and vunet open everything close-on-exec. Call it first
// thing, before anything is opened; it returns what it closed.
func CloseInheritedFDs(keep ...int) []int {
	keep = append(keep, listenFDs()...)
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	var closed []int
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 || contains(keep, fd) {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC != 0 {
			continue // ours (including the directory being read), or gone
		}
		if unix.Close(fd) == nil {
			closed = append(closed, fd)
		}
	}
	sort.Ints(closed)
	return closed
}

// listenFDs are the descriptors systemd passes for socket activation:
// 3 … 3+LISTEN_FDS-1, when LISTEN_PID names this process.
func listenFDs() []int {
	pid, err := strconv.Atoi(os.Getenv("LISTEN_PID"))
	if err != nil || pid != os.Getpid() {
		return nil
	}
	n, err := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	if err != nil || n <= 0 {
		return nil
	}
	fds := make([]int, n)
	for i := range fds {
		fds[i] = 3 + i
	}
	return fds
}

func contains(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

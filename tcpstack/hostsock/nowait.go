package hostsock

import "golang.org/x/sys/unix"

// The system calls of an event loop's data path never sleep: socket calls
// carry MSG_DONTWAIT on non-blocking sockets, and socket options and queue
// ioctls only read or set a field under the socket's lock. nowait makes
// them as raw system calls, which the Go scheduler takes for computation.
//
// Through unix.Syscall, a call that outlasts one tick of the runtime's
// monitor thread (sysmon: 20 µs while it finds work, a 64 KB copy takes
// about that) loses its P: sysmon hands it to a fresh thread, and on
// return the loop, with GOMAXPROCS equal to the number of loops
// (tcpstack/loop_wait.go), finds no P free, parks its own thread on a futex
// and carries on on the other one. Each such call paid two thread wake-ups
// and kept sysmon polling every 20 µs. A loop holds its P on purpose
// (Epoll.WaitHeld); a call that cannot sleep keeps it the same way. The
// cost is that a stop-the-world waits for the call to return, which the
// call bounds itself: it copies at most one batch.
func nowait(trap, a1, a2, a3 uintptr) (uintptr, unix.Errno) {
	r, _, e := unix.RawSyscall(trap, a1, a2, a3)
	return r, e
}

// nowait6 is nowait for calls of up to six arguments.
func nowait6(trap, a1, a2, a3, a4, a5, a6 uintptr) (uintptr, unix.Errno) {
	r, _, e := unix.RawSyscall6(trap, a1, a2, a3, a4, a5, a6)
	return r, e
}

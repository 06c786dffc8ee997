package hostsock

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawcall makes a system call that cannot block (a non-blocking socket,
// MSG_DONTWAIT, a socket option) without telling the Go scheduler
// (RawSyscall6: no entersyscall and exitsyscall). Besides the two calls it
// saves, an ordinary system call made while the runtime's monitor thread
// sleeps wakes that thread, which then ticks every 20 µs for a
// millisecond: the event loop parks with every P idle so that it sleeps
// (epoll_park.go). Only for calls that return at once: one that blocked
// would hold the P, and with it the loop's share of the process.
func rawcall(trap, a1, a2, a3, a4, a5, a6 uintptr) (uintptr, unix.Errno) {
	r, _, e := unix.RawSyscall6(trap, a1, a2, a3, a4, a5, a6)
	return r, e
}

// DrainCounter empties a non-blocking eventfd or timerfd (a read of its
// 8-byte counter), as the event loop does on its wake-ups.
func DrainCounter(fd int) {
	var b [8]byte
	rawcall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 8, 0, 0, 0)
}

// AddCounter adds 1 to a non-blocking eventfd's counter. A counter at its
// maximum (EAGAIN) has a wake-up pending already.
func AddCounter(fd int) error {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], 1)
	if _, e := rawcall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 8, 0, 0, 0); e != 0 && e != unix.EAGAIN {
		return e
	}
	return nil
}

// SetTimer is timerfd_settime with relative times.
func SetTimer(fd int, spec *unix.ItimerSpec) error {
	if _, e := rawcall(unix.SYS_TIMERFD_SETTIME, uintptr(fd), 0, uintptr(unsafe.Pointer(spec)), 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

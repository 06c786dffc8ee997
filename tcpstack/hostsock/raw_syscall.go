package hostsock

// Raw system calls on the data path.
//
// The system calls an event loop makes per packet or batch never wait for
// a peer or for data: socket calls carry MSG_DONTWAIT on non-blocking
// sockets, and socket options and queue ioctls read or set the socket's
// state. They are made with unix.RawSyscall, which the Go scheduler takes
// for computation, and not with unix.Syscall. Each call site converts its
// pointers to uintptr in the call expression itself, as the unsafe.Pointer
// rules ask: no wrapper, whose stack could move between the conversion and
// the call.
//
// Through unix.Syscall, a call that the runtime's monitor thread (sysmon)
// finds on two of its ticks (20 µs apart while it finds work, up to 10 ms
// when idle) loses its P: sysmon hands the P to a fresh thread, and when
// that thread still holds it as the call returns, the loop, with
// GOMAXPROCS equal to the number of loops (tcpstack/loop_wait.go), parks
// its own thread on a futex and carries on on the other one. A batch of
// large copies (a recvmmsg of 16 GRO runs moves a MiB) or a page fault on
// guest memory lasts that long. strace of a UDP run showed the loop
// hopping between two threads with FUTEX_WAIT between its recvmmsg calls.
// A loop holds its P on purpose (Epoll.WaitHeld); a call that returns
// without waiting for anyone keeps it the same way.
//
// Such a call can still sleep briefly inside the kernel, as any code can:
// on the socket's lock while another task holds it, in memory reclaim
// while allocating, on a page fault in guest memory. A stop-the-world
// waits for it to return, which can then take that long.

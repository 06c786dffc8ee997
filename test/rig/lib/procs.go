package rig

import (
	"runtime"
	"sync"
)

// Why every rig loop brings a P of its own.
//
// The rig's loops (a bridge's TX loop and RX loops, the rig-alone device)
// each run on a locked thread and sleep in epoll_wait. A goroutine blocked
// in a system call keeps its P (the Go runtime's right to run Go code)
// until the runtime's monitor (sysmon) takes it back, which it does only
// after 20 µs to 10 ms, and then only while other goroutines wait. With
// GOMAXPROCS at the CPU count (2 here) and four loops asleep, every P sat
// in an epoll_wait most of the time, and the goroutines the loops serve —
// the tests' and the bench's clients and servers, standing for the guest's
// and the host's programs, which in a real VM never share a scheduler with
// the front-end — waited for sysmon to free one: a 1-byte round trip
// through the rig alone (four loops) took 210 µs, through the rig and
// vunet (two loops here, the rest in vunet's process) 80 µs, so the
// baseline meant to be the rig's own share came out larger than the
// whole. A go trace showed netpoller-woken goroutines Runnable for ~100 µs
// before they ran.
//
// So each loop raises GOMAXPROCS by one while it runs (reserveP, from the
// start of a bridge or device until its loop returns): a loop's
// sleep no longer takes a P from anything else, sysmon leaves a sleeping
// loop's P alone (it does while Ps are idle, for up to 10 ms), and the loop
// gets its own P back on waking without a hand-off.
var reservedPs struct {
	sync.Mutex
	n int // Ps reserved by the loops running now
}

// reserveP adds delta (1: a loop starts, -1: it stopped) to the loops
// running in this process and moves GOMAXPROCS by as much, never below 1.
func reserveP(delta int) {
	reservedPs.Lock()
	defer reservedPs.Unlock()
	reservedPs.n += delta
	runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0)+delta, 1))
}

// reservedPCount is how many Ps the running loops added to GOMAXPROCS.
func reservedPCount() int {
	reservedPs.Lock()
	defer reservedPs.Unlock()
	return reservedPs.n
}

package tcpstack

import (
	"errors"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// How an event loop sleeps, and what it costs in the Go runtime.
//
// A goroutine blocked in a system call keeps its P (the runtime's right to
// run Go code) in a syscall state, and the runtime's monitor thread
// (sysmon) takes it away once the call lasts too long or once the goroutine
// has run for 10 ms without passing through the scheduler, which a loop
// that only makes system calls never does. Taking the P costs thread
// hand-offs (futex wake-ups) and, on the way back, a P to find; every take
// also resets sysmon's back-off, so it polls again every 20 µs for a
// millisecond (nanosleep). Measured under a QEMU guest, that was about 40%
// of vunet's CPU: more than the data path's own system calls.
//
// So a loop:
//   - waits with the P held (hostsock.Epoll.WaitHeld, a raw system call)
//     for up to heldWait: the runtime sees a running goroutine, there is
//     nothing to take, and sysmon backs off to its 10 ms period;
//   - passes through the scheduler (runtime.Gosched) at least every
//     yieldEvery, so sysmon never preempts it (a signal, then the same
//     hand-offs). A yield is not free either: with a P idle (reserveP
//     keeps one), Gosched wakes a thread to look for work, a futex
//     wake-up and two context switches, about half the runtime's futex
//     calls under a QEMU guest at a 5 ms period. sysmon preempts a
//     goroutine it has seen running for 10 ms, so the loop yields just
//     inside that, every 9 ms;
//   - after heldWait with no event, waits the ordinary way: an idle loop
//     gives its P back, the runtime (sysmon included) goes to sleep, and
//     an idle daemon burns nothing.
//
// A held wait takes a P from everything else while it lasts, so the Stack
// keeps GOMAXPROCS above the number of running loops (reserveP): the
// control plane, metrics and the garbage collector keep one. A garbage
// collection that must stop the world still stops the loop at once: its
// preemption signal ends the held wait (EINTR).
const (
	heldWait   = 50 // milliseconds
	yieldEvery = 9 * time.Millisecond
)

// wait fills l.events: at once when timeout is 0, otherwise sleeping until
// something is ready.
func (l *loop) wait(timeout int) (int, error) {
	if timeout == 0 {
		return l.ep.WaitHeld(l.events[:], 0)
	}
	start := time.Now()
	l.yieldIfDue(start)
	// A signal (sysmon's preemption request, about every 10 ms) ends a
	// held wait early; the next one waits only for the rest of heldWait.
	// Starting over instead kept an idle loop in held waits for ever.
	for left := heldWait * time.Millisecond; left > 0; left = heldWait*time.Millisecond - time.Since(start) {
		n, err := l.ep.WaitHeld(l.events[:], int((left+time.Millisecond-1)/time.Millisecond))
		if n != 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
			return n, err
		}
	}
	return l.ep.Wait(l.events[:], timeout)
}

// yieldIfDue passes through the scheduler when the last pass is yieldEvery
// old.
func (l *loop) yieldIfDue(now time.Time) {
	if now.Sub(l.lastYield) < yieldEvery {
		return
	}
	runtime.Gosched()
	l.lastYield = now
}

// runningLoops counts the event loops of every Stack in the process, for
// reserveP.
var runningLoops struct {
	sync.Mutex
	n int
}

// reserveP counts a loop in (delta 1) or out (-1) and raises GOMAXPROCS
// so that one P is left over when every loop holds one in a wait.
// GOMAXPROCS is never lowered again: the Ps of stopped loops sit idle.
func reserveP(delta int) {
	runningLoops.Lock()
	defer runningLoops.Unlock()
	runningLoops.n += delta
	if want := runningLoops.n + 1; delta > 0 && runtime.GOMAXPROCS(0) < want {
		runtime.GOMAXPROCS(want)
	}
}

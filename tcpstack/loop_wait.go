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
//     hand-offs). sysmon preempts a goroutine it has seen running for
//     10 ms, so the loop yields just inside that, every 9 ms;
//   - after heldWait with no event, waits the ordinary way: an idle loop
//     gives its P back, the runtime (sysmon included) goes to sleep, and
//     an idle daemon burns nothing.
//
// GOMAXPROCS is the number of running loops (reserveP), not one more. With
// a P idle, every runtime.Gosched made the runtime wake a thread to look
// for work (a futex wake-up and two context switches that found nothing):
// under a QEMU guest those yields, and the preemptions they stood in for,
// were most of vunet's futex, sched_yield and signal system calls. With
// every P held by a loop there is no one to wake. The rest of the process
// — the vhost-user control plane, the metrics endpoint, timers — runs on
// a loop's P while the loop yields, so a loop is away from its rings for
// as long as that work takes (a vhost-user message: microseconds; a
// metrics scrape: a millisecond or two). A goroutine waiting for a socket
// needs more than a Gosched: the scheduler takes the runnable loop before
// it polls the network, and only sysmon polls otherwise (every 10 ms). So
// the loop also watches the vhost-user socket (QueuePair.ControlFD) and,
// when a message comes, yields through the netpoller (hostsock.Yielder):
// QEMU's requests are answered at once, not 10 ms later, which is what
// a migration's downtime is made of.
//
// A garbage collection that must stop the world stops the loop at once:
// its preemption signal ends the held wait (EINTR).
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
	n    int
	base int // GOMAXPROCS when the first of the running loops started
}

// yieldToControl lets the control plane, readied by a vhost-user message,
// run now: the Yielder makes the scheduler poll the network, and Gosched
// runs what the poll readied before the loop goes on.
func (l *loop) yieldToControl() {
	if err := l.yielder.Yield(); err != nil {
		l.log.Warn("yield to the control plane", "err", err)
	}
	runtime.Gosched()
	l.lastYield = l.now
}

// reserveP counts a loop in (delta 1) or out (-1) and sets GOMAXPROCS to
// the number of running loops: a P for each, none idle (see above). When
// the last loop stops, GOMAXPROCS goes back to what it was before the
// first started (the runtime's default, or the user's GOMAXPROCS).
func reserveP(delta int) {
	runningLoops.Lock()
	defer runningLoops.Unlock()
	if runningLoops.n == 0 && delta > 0 {
		runningLoops.base = runtime.GOMAXPROCS(0)
	}
	runningLoops.n += delta
	want := runningLoops.n
	if want <= 0 {
		runningLoops.n, want = 0, runningLoops.base
	}
	if want > 0 && runtime.GOMAXPROCS(0) != want {
		runtime.GOMAXPROCS(want)
	}
}

package tcpstack

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
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
//   - makes its socket I/O, socket-option and eventfd-signal calls raw
//     too (hostsock/raw_syscall.go, virtqueue's eventfd I/O; epoll_ctl and
//     the loop's own eventfds are not, being short): none waits for a
//     peer or for data, and a long one (a batch of large copies, a page
//     fault on guest memory) through the scheduler could lose the P and
//     move the loop to another thread;
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
// A garbage collection that must stop the world stops a loop in a held
// wait at once (its preemption signal ends the wait with EINTR), and one in
// a raw data-path call when the call returns.
const (
	heldWait   = 50 // milliseconds
	yieldEvery = 9 * time.Millisecond
)

// wait fills l.events: with what is ready now when until has passed,
// otherwise sleeping until something is ready or until comes (zero: no
// limit), after polling for l.pollFor when that is not zero. It returns 0
// events when until came first.
func (l *loop) wait(until time.Time) (int, error) {
	// Work left over (run passes l.now) or a timer already due by the
	// iteration's clock: a look, without reading the clock again.
	if !until.IsZero() && !until.After(l.now) {
		return l.ep.WaitHeld(l.events[:], 0)
	}
	start := time.Now()
	if !until.IsZero() && !start.Before(until) {
		return l.ep.WaitHeld(l.events[:], 0)
	}
	if l.yieldIfDue(start) {
		// What ran meanwhile (a metrics scrape, say) is not part of the
		// gap the poll adapts to.
		start = time.Now()
	}
	if l.pollFor > 0 && pollAllowed.Load() && !l.bulk {
		n, err, hit := l.poll(start)
		if hit {
			l.st.PollHits.Add(1)
			l.pollFor = nextPoll(l.pollFor, time.Since(start))
			return n, err
		}
		l.st.PollMisses.Add(1)
		l.pollFor = 0
	}
	n, err := l.sleep(start, until)
	if n > 0 {
		l.pollFor = nextPoll(0, time.Since(start))
	}
	return n, err
}

// waitTimeout is epoll_wait's timeout from now until until: milliseconds,
// rounded up so that the wait never ends before until, and at most
// maxWait (the kernel takes an int: an idle timeout of weeks would
// overflow it); -1 (none) for a zero until.
func waitTimeout(now, until time.Time) int {
	if until.IsZero() {
		return -1
	}
	d := min(until.Sub(now), maxWait)
	if d <= 0 {
		return 0
	}
	return int((d + time.Millisecond - 1) / time.Millisecond)
}

// maxWait bounds one wait for a deadline; a longer one is waited for in
// several.
const maxWait = time.Hour

// Bounded busy-polling, where the next event follows soon.
//
// A loop that sleeps in epoll_wait is woken by the kernel: an IPI or a
// vCPU's wake-up in a VM, then a context switch. On the rig's
// request/response test that cost about a third of vunet's share of the
// round trip: with every sleep replaced by 50 µs of polling first, the
// share went from 66-84 µs to 46-50 µs (about 3.2x to 2.1x the kernel's
// own round trip). But polling spends a core doing nothing, which a VM
// pays for: under a QEMU guest the events of a transfer come milliseconds
// apart, and the guest needs the CPU. So the loop polls only where the
// last wait showed the next event coming sooner than pollMax (the way
// KVM's halt-polling adapts): it polls for twice that gap, at least
// pollMin, at most pollMax, and one poll that finds nothing stops the
// polling until a short gap is seen again. The most a run of long gaps
// costs is one pollMax per short gap before it. And no loop polls while
// there are as many loops as CPUs the process may use (reserveP sets
// pollAllowed): then the threads that make the events (QEMU's, the
// kernel's softirqs, a peer) would wait for the CPU a loop spins on.
//
// Nor does a loop poll after an iteration that moved bulkBytes or more
// (l.bulk). In a bulk transfer the next event always comes soon, so the
// adaptation kept the loop polling for as long as the transfer lasted,
// and what that buys, a wake-up some microseconds sooner, a full pipeline
// does not need; the CPU it spins on is taken from the peers it shares
// the CPUs with. On the rig (2 CPUs, iperf3 3 s each way at MTU 65520)
// the loop made 220-300 thousand epoll_wait calls polling and 100
// thousand with this rule, and the bench's host→guest TCP rows took 0.81
// to 0.93 times the CPU per GB at 0.92 to 1.13 times the throughput.
// Small requests and answers, handshakes and pings move far less an
// iteration and keep polling (the rig's round trips and connection rate
// did not change). What loses the poll is an iteration that carries 16 KB
// or more, such as a large answer, or small exchanges sharing a queue pair
// with a bulk flow.
const (
	pollMin = 10 * time.Microsecond
	pollMax = 50 * time.Microsecond
	// bulkBytes is what an iteration moves, to and from the guest
	// together, that marks a bulk transfer: about eleven frames at MTU
	// 1500, a quarter of a 64 KB TSO frame. An answer that large is
	// streamed, not waited for in a tight round trip.
	bulkBytes = 16 << 10
)

// nextPoll is how long the loop polls before its next sleep, after a wait
// that found its event gap after it started; cur is the poll that found
// it (0: it slept).
func nextPoll(cur, gap time.Duration) time.Duration {
	if gap >= pollMax {
		return 0
	}
	return min(max(2*gap, pollMin, cur), pollMax)
}

// poll checks for events without sleeping until l.pollFor has passed
// since start; hit reports that it found some (or an error).
func (l *loop) poll(start time.Time) (n int, err error, hit bool) {
	for {
		n, err = l.ep.WaitHeld(l.events[:], 0)
		if n != 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
			return n, err, true
		}
		if time.Since(start) >= l.pollFor {
			return 0, nil, false
		}
	}
}

// sleep waits for events until until (zero: no limit), with the P held
// for up to heldWait (see above), then the ordinary way.
func (l *loop) sleep(start, until time.Time) (int, error) {
	held := start.Add(heldWait * time.Millisecond)
	if !until.IsZero() && until.Before(held) {
		held = until
	}
	// A signal (sysmon's preemption request, about every 10 ms) ends a
	// held wait early; the next one waits only for the rest of heldWait.
	// Starting over instead kept an idle loop in held waits for ever.
	// From now, not start: a poll may have taken some of the wait.
	for now := time.Now(); now.Before(held); now = time.Now() {
		n, err := l.ep.WaitHeld(l.events[:], waitTimeout(now, held))
		if n != 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
			return n, err
		}
	}
	if held.Equal(until) {
		return 0, nil
	}
	return l.ep.Wait(l.events[:], waitTimeout(time.Now(), until))
}

// yieldIfDue passes through the scheduler when the last pass is yieldEvery
// old, and reports whether it did.
func (l *loop) yieldIfDue(now time.Time) bool {
	if now.Sub(l.lastYield) < yieldEvery {
		return false
	}
	runtime.Gosched()
	l.lastYield = now
	return true
}

// pollAllowed says whether loops may busy-poll: fewer of them run than
// the process has CPUs.
var pollAllowed atomic.Bool

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
	pollAllowed.Store(runningLoops.n < runtime.NumCPU())
	want := runningLoops.n
	if want <= 0 {
		runningLoops.n, want = 0, runningLoops.base
	}
	if want > 0 && runtime.GOMAXPROCS(0) != want {
		runtime.GOMAXPROCS(want)
	}
}

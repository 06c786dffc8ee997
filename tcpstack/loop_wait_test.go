package tcpstack

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// A loop holds a P while it waits for its next event, and GOMAXPROCS is
// the number of running loops (loop_wait.go): everything else in the
// process — here the test's goroutine, and garbage collections that stop
// the world — runs while the loop yields. Starting from GOMAXPROCS 3, one
// loop brings it to 1, the process keeps running beside a busy loop, and
// GOMAXPROCS is 3 again once the loop stopped.
func TestLoopsOwnOnePEach(t *testing.T) {
	old := runtime.GOMAXPROCS(3)
	t.Cleanup(func() { runtime.GOMAXPROCS(old) })
	p := newTestPair(t, featModern, 64)
	p.postRX(16, 2048)
	p.start()
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("GOMAXPROCS = %d with one loop running, want 1", got)
	}
	for i := 1; i <= 8; i++ {
		p.addTX(arpRequest(testGuestIP, testGwIP))
		p.tx.Send()
		runtime.GC() // stops the world: the held wait must give way
		waitFor(t, "ARP reply", 5*time.Second, func() bool { return p.rx.UsedIdx() == uint16(i) })
	}
	_, frames := p.rxRead(t)
	want := arpReplyFor(testGuestIP, testGwIP)
	for i, f := range frames {
		if !bytes.Equal(f, want) {
			t.Fatalf("reply %d\n got %x\nwant %x", i, f, want)
		}
	}
	if len(frames) != 8 {
		t.Fatalf("%d replies, want 8", len(frames))
	}
	p.s.StopPair(0)
	if got := runtime.GOMAXPROCS(0); got != 3 {
		t.Fatalf("GOMAXPROCS = %d after the loop stopped, want 3 again", got)
	}
}

// An idle loop gives its P back: after heldWait without events it waits
// the ordinary way, and the runtime sees its goroutine in a system call
// (a goroutine in a held wait looks like one running on another thread,
// with no stack to show).
func TestIdleLoopGivesItsPBack(t *testing.T) {
	p := newTestPair(t, featModern, 64)
	p.rx.AddBuffers(nil, 2048)
	p.rx.Post()
	p.start()
	p.addTX(arpRequest(testGuestIP, testGwIP))
	p.tx.Send()
	waitFor(t, "ARP reply", 5*time.Second, func() bool { return p.rx.UsedIdx() == 1 })
	// Reading every goroutine's stack stops the world, which ends a held
	// wait early: look seldom enough for heldWait to pass in between.
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(4 * heldWait * time.Millisecond) {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "tcpstack.(*loop).run(") && strings.Contains(strings.SplitN(g, "\n", 2)[0], "[syscall") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle loop never waited in an ordinary system call:\n%s", buf[:n])
		}
	}
}

// nextPoll polls for twice a short gap, within [pollMin, pollMax], never
// less than the poll that just caught an event, and not at all after a gap
// of pollMax or more.
func TestNextPoll(t *testing.T) {
	us := time.Microsecond
	for _, c := range []struct{ cur, gap, want time.Duration }{
		{0, 2 * us, pollMin},
		{0, 15 * us, 30 * us},
		{0, 40 * us, pollMax},
		{0, pollMax, 0},
		{0, time.Millisecond, 0},
		{pollMax, 3 * us, pollMax},
		{20 * us, 12 * us, 24 * us},
		{20 * us, pollMax, 0},
	} {
		if got := nextPoll(c.cur, c.gap); got != c.want {
			t.Errorf("nextPoll(%v, %v) = %v, want %v", c.cur, c.gap, got, c.want)
		}
	}
}

// A loop's wait polls before it sleeps when pollFor says so: an event the
// kernel raises during the poll (a timerfd, which needs no goroutine to
// fire) is a hit, taken without sleeping; one that comes after the poll
// ran out is a miss, and the long gap ends the polling: the next wait
// sleeps at once.
func TestLoopWaitPolls(t *testing.T) {
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	l := waitingLoop(t, tfd, loopFDTimer)
	fire := func(after time.Duration) {
		t.Helper()
		var b [8]byte
		unix.Read(tfd, b[:])
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(after.Nanoseconds())}
		if err := unix.TimerfdSettime(tfd, 0, &spec, nil); err != nil {
			t.Fatal(err)
		}
	}

	// Polling for a second, the timer due in 20 ms is a hit. (Due in
	// much less, it can be due before the wait starts on a loaded machine:
	// a gap of nothing, which keeps the loop polling.)
	l.pollFor = time.Second
	fire(20 * time.Millisecond)
	if n, err := waitRetry(l, time.Time{}); n != 1 || err != nil {
		t.Fatalf("wait: %d events, %v", n, err)
	}
	if h, m := l.st.PollHits.Load(), l.st.PollMisses.Load(); h != 1 || m != 0 {
		t.Fatalf("event within the poll: %d hits, %d misses; want 1 and 0", h, m)
	}
	if l.pollFor != 0 {
		t.Fatalf("after a hit 20 ms in, pollFor = %v, want 0 (a gap above pollMax)", l.pollFor)
	}

	// Polling for 100 µs, the timer due in 100 ms is a miss, and the loop
	// sleeps until it.
	l.pollFor = 100 * time.Microsecond
	start := time.Now()
	fire(100 * time.Millisecond)
	if n, err := waitRetry(l, time.Time{}); n != 1 || err != nil {
		t.Fatalf("wait: %d events, %v", n, err)
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Fatalf("the wait returned after %v, before the timer", took)
	}
	if h, m := l.st.PollHits.Load(), l.st.PollMisses.Load(); h != 1 || m != 1 {
		t.Fatalf("event after the poll: %d hits, %d misses; want 1 and 1", h, m)
	}
	if l.pollFor != 0 {
		t.Fatalf("after a 100 ms gap, pollFor = %v, want 0", l.pollFor)
	}

	// Not polling, the next wait neither hits nor misses; nor does one
	// with polling not allowed (as many loops as CPUs).
	for _, allowed := range []bool{true, false} {
		pollAllowed.Store(allowed)
		if !allowed {
			l.pollFor = time.Second
		}
		fire(time.Millisecond)
		if n, err := waitRetry(l, time.Time{}); n != 1 || err != nil {
			t.Fatalf("wait: %d events, %v", n, err)
		}
		if h, m := l.st.PollHits.Load(), l.st.PollMisses.Load(); h != 1 || m != 1 {
			t.Fatalf("a wait that did not poll (allowed %v): %d hits, %d misses; want 1 and 1", allowed, h, m)
		}
	}
}

// After an iteration that moved a bulk transfer's worth (l.bulk), the
// next wait sleeps without polling, however short the last gap was; after
// a small one it polls again.
func TestLoopWaitNoPollAfterBulk(t *testing.T) {
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	l := waitingLoop(t, tfd, loopFDTimer)
	for _, bulk := range []bool{true, false} {
		var b [8]byte
		unix.Read(tfd, b[:])
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(time.Millisecond.Nanoseconds())}
		if err := unix.TimerfdSettime(tfd, 0, &spec, nil); err != nil {
			t.Fatal(err)
		}
		l.bulk, l.pollFor = bulk, time.Second
		h0, m0 := l.st.PollHits.Load(), l.st.PollMisses.Load()
		if n, err := waitRetry(l, time.Time{}); n != 1 || err != nil {
			t.Fatalf("bulk %v: wait: %d events, %v", bulk, n, err)
		}
		polled := l.st.PollHits.Load() - h0 + l.st.PollMisses.Load() - m0
		want := uint64(1) // a hit: the timer fires within the poll
		if bulk {
			want = 0
		}
		if polled != want {
			t.Fatalf("after an iteration with bulk %v the wait counted %d polls, want %d", bulk, polled, want)
		}
	}
}

// The loop's timers are its wait's timeout (armTimer): a wait with
// nothing ready ends at its deadline, not before, with no events, whether
// it starts with a poll or not, whether the deadline falls within the
// held wait or after it; a deadline already past makes the wait only
// look, even with an event due a moment later.
func TestLoopWaitEndsAtDeadline(t *testing.T) {
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	l := waitingLoop(t, efd, loopFDWake)
	for _, c := range []struct {
		name    string
		pollFor time.Duration
		after   time.Duration
	}{
		{"within the held wait", 0, 30 * time.Millisecond},
		{"after a poll", pollMax, 20 * time.Millisecond},
		{"past the held wait", 0, heldWait*time.Millisecond + 40*time.Millisecond},
	} {
		l.pollFor = c.pollFor
		until := time.Now().Add(c.after)
		n, err := l.wait(until)
		if n != 0 || err != nil {
			t.Fatalf("%s: wait with nothing ready: %d events, %v", c.name, n, err)
		}
		if now := time.Now(); now.Before(until) {
			t.Fatalf("%s: the wait ended %v before its deadline", c.name, until.Sub(now))
		}
	}

	// A deadline in the past: the wait looks once and returns, before
	// the event due 200 ms later (a wait that slept would report it).
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(200 * time.Millisecond)
		var one = [8]byte{1}
		unix.Write(efd, one[:])
	}()
	if n, err := l.wait(time.Now().Add(-time.Millisecond)); n != 0 || err != nil {
		t.Fatalf("past deadline: %d events, %v; want 0 at once", n, err)
	}
	<-done
	// And it reports what is ready.
	if n, err := l.wait(time.Now().Add(-time.Millisecond)); n != 1 || err != nil {
		t.Fatalf("past deadline with an event ready: %d events, %v; want 1", n, err)
	}
}

// A loop woken more often than once a millisecond (a guest's kicks, a
// peer's segments, work left over) still runs a timer when it is due: the
// millisecond that keeps a timer that stays due from spinning the loop
// counts from the last run, not from each iteration, which would push
// the deadline ahead of the loop for as long as it stays busy.
func TestLoopTimerRunsWhileBusy(t *testing.T) {
	p := newFlowPair(t, featModern, nil)
	p.start() // the pair's tables, which armTimer asks, then a loop of our own
	p.s.StopPair(0)
	ps := p.s.pairs[0]
	l := &loop{s: p.s, ps: ps, flows: ps.flows, tcp: ps.tcp}
	t0 := time.Now()
	l.now = t0
	l.nextRA = t0.Add(5 * time.Millisecond)
	l.armTimer()
	// Iterations 500 µs apart, as run makes them: the timer runs on the
	// first wake-up at or after the deadline.
	ran := 0
	for i := 1; i <= 40; i++ {
		l.now = t0.Add(time.Duration(i) * 500 * time.Microsecond)
		if l.timerDue() { // the RA stays due: nothing here sends it
			ran++
			if ran == 1 && l.now.Sub(t0) != 5*time.Millisecond {
				t.Fatalf("timer due at +5ms ran at %v", l.now.Sub(t0))
			}
		}
		l.armTimer()
	}
	// Still due (nothing sent it), it runs once a millisecond: at 5, 6,
	// ... 20 ms, not on each of the 30 wake-ups since.
	if ran != 16 {
		t.Fatalf("a timer that stays due ran %d times in 15 ms of wake-ups 500 µs apart, want 16 (once a millisecond)", ran)
	}
}

// waitTimeout rounds up to whole milliseconds, so a wait never ends early.
func TestWaitTimeout(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		until time.Time
		want  int
	}{
		{time.Time{}, -1},
		{now.Add(-time.Second), 0},
		{now, 0},
		{now.Add(time.Nanosecond), 1},
		{now.Add(time.Millisecond), 1},
		{now.Add(9500 * time.Microsecond), 10},
		{now.Add(200 * time.Millisecond), 200},
		{now.Add(90 * 24 * time.Hour), int(maxWait / time.Millisecond)},
	} {
		if got := waitTimeout(now, c.until); got != c.want {
			t.Errorf("waitTimeout(now, until) with until-now = %v: %d, want %d", c.until.Sub(now), got, c.want)
		}
	}
}

// waitingLoop is a loop with only what wait needs: an epoll set that
// watches fd (closed with it at the test's end) under the loop's own slot,
// and polling allowed.
func waitingLoop(t *testing.T, fd int, slot uint32) *loop {
	t.Helper()
	ep, err := hostsock.NewEpoll()
	if err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close(); unix.Close(fd) })
	if err := ep.Add(fd, unix.EPOLLIN, hostsock.NewToken(hostsock.OwnerLoop, 0, slot)); err != nil {
		t.Fatal(err)
	}
	was := pollAllowed.Load()
	pollAllowed.Store(true)
	t.Cleanup(func() { pollAllowed.Store(was) })
	return &loop{ep: ep, st: &stats.Queue{}}
}

// waitRetry is l.wait again after EINTR, as the loop's run does: past the
// held wait the loop waits the ordinary way, which the runtime's
// preemption signal can interrupt.
func waitRetry(l *loop, until time.Time) (int, error) {
	for {
		n, err := l.wait(until)
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// Loops may poll while fewer of them run than the process has CPUs.
func TestPollAllowedBelowCPUCount(t *testing.T) {
	old := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(old) })
	cpus := runtime.NumCPU()
	for n := 1; n <= cpus; n++ {
		reserveP(1)
		if got, want := pollAllowed.Load(), n < cpus; got != want {
			t.Errorf("%d loops on %d CPUs: pollAllowed %v, want %v", n, cpus, got, want)
		}
	}
	for range cpus {
		reserveP(-1)
	}
	if !pollAllowed.Load() {
		t.Error("no loops left: polling still not allowed")
	}
}

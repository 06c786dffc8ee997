package tcpstack

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
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
		runtime.GC() // stops the world while the loop runs or sleeps
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

// A loop that sleeps between events leaves the rest of the runtime
// asleep too: with a timerfd waking it every 2 ms for 400 ms, the
// process's other threads wake hardly at all. Sleeping in epoll_wait with
// its P held, the loop kept the runtime's monitor ticking every 10 ms at
// best (40 wake-ups here, more while it backs off); sleeping in an
// ordinary blocking epoll_wait, it had its P taken and handed back.
func TestLoopSleepLeavesRuntimeAsleep(t *testing.T) {
	old := runtime.GOMAXPROCS(1) // as reserveP sets it for one loop
	t.Cleanup(func() { runtime.GOMAXPROCS(old) })
	l, tfd := newWaitLoop(t)
	ts := unix.NsecToTimespec((2 * time.Millisecond).Nanoseconds())
	if err := unix.TimerfdSettime(tfd, 0, &unix.ItimerSpec{Interval: ts, Value: ts}, nil); err != nil {
		t.Fatal(err)
	}
	const waits = 200
	done := make(chan error)
	var before, after map[int]uint64
	go func() {
		// Warm up (threads started, sysmon's back-off settled), then count.
		for range 20 {
			l.wait(-1)
			hostsock.DrainCounter(tfd)
		}
		before = threadSwitches(t)
		for range waits {
			if n, err := l.wait(-1); n != 1 || err != nil {
				done <- fmt.Errorf("wait: %d events, %v", n, err)
				return
			}
			hostsock.DrainCounter(tfd)
		}
		after = threadSwitches(t)
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The loop's own wake-ups are on the busiest thread; the rest is what
	// the runtime's other threads did meanwhile.
	var busiest, total uint64
	for tid, n := range after {
		d := n - before[tid]
		total += d
		busiest = max(busiest, d)
	}
	if busiest < waits {
		t.Fatalf("the busiest thread switched %d times in %d waits", busiest, waits)
	}
	if others := total - busiest; others > 10 {
		t.Fatalf("other threads switched %d times while the loop waited %d times 2 ms apart, want 10 at most (busiest %d)",
			others, waits, busiest)
	}
}

// threadSwitches reads the context switches of each of the process's
// threads.
func threadSwitches(t *testing.T) map[int]uint64 {
	dir, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Error(err)
		return nil
	}
	m := make(map[int]uint64, len(dir))
	for _, e := range dir {
		tid, _ := strconv.Atoi(e.Name())
		raw, err := os.ReadFile("/proc/self/task/" + e.Name() + "/status")
		if err != nil {
			continue // the thread exited
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				m[tid] += n
			}
		}
	}
	return m
}

// newWaitLoop makes a loop with only what wait needs, and a timerfd in its
// epoll set.
func newWaitLoop(t *testing.T) (*loop, int) {
	ep, err := hostsock.NewEpoll()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	parker, err := hostsock.NewParker(ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { parker.Close() })
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(tfd) })
	if err := ep.Add(tfd, unix.EPOLLIN, hostsock.NewToken(hostsock.OwnerLoop, 0, loopFDTimer)); err != nil {
		t.Fatal(err)
	}
	return &loop{ep: ep, parker: parker, st: &stats.Queue{}}, tfd
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
	l, tfd := newWaitLoop(t)
	was := pollAllowed.Load()
	pollAllowed.Store(true)
	t.Cleanup(func() { pollAllowed.Store(was) })
	fire := func(after time.Duration) {
		t.Helper()
		var b [8]byte
		unix.Read(tfd, b[:])
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(after.Nanoseconds())}
		if err := unix.TimerfdSettime(tfd, 0, &spec, nil); err != nil {
			t.Fatal(err)
		}
	}

	// Polling for a second, the timer due in a millisecond is a hit.
	l.pollFor = time.Second
	fire(time.Millisecond)
	if n, err := l.wait(-1); n != 1 || err != nil {
		t.Fatalf("wait: %d events, %v", n, err)
	}
	if h, m := l.st.PollHits.Load(), l.st.PollMisses.Load(); h != 1 || m != 0 {
		t.Fatalf("event within the poll: %d hits, %d misses; want 1 and 0", h, m)
	}
	if l.pollFor != 0 {
		t.Fatalf("after a hit a millisecond in, pollFor = %v, want 0 (a gap above pollMax)", l.pollFor)
	}

	// Polling for 100 µs, the timer due in 100 ms is a miss, and the loop
	// sleeps until it.
	l.pollFor = 100 * time.Microsecond
	start := time.Now()
	fire(100 * time.Millisecond)
	if n, err := l.wait(-1); n != 1 || err != nil {
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
		if n, err := l.wait(-1); n != 1 || err != nil {
			t.Fatalf("wait: %d events, %v", n, err)
		}
		if h, m := l.st.PollHits.Load(), l.st.PollMisses.Load(); h != 1 || m != 1 {
			t.Fatalf("a wait that did not poll (allowed %v): %d hits, %d misses; want 1 and 1", allowed, h, m)
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

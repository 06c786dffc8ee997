package tcpstack

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"
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

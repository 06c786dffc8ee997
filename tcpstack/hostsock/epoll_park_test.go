package hostsock

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// parkerWithEventfd is a Parker over an epoll set holding one eventfd.
func parkerWithEventfd(t testing.TB) (*Parker, int, Token) {
	ep, err := NewEpoll()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	p, err := NewParker(ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(efd) })
	tok := NewToken(OwnerLoop, 3, 7)
	if err := ep.Add(efd, unix.EPOLLIN, tok); err != nil {
		t.Fatal(err)
	}
	return p, efd, tok
}

// A parked Wait returns when an fd of the set becomes ready, with that
// fd's event; ten times over, so a wake-up consumed by one round cannot
// be what the next returns on.
func TestParkerWakesOnEvent(t *testing.T) {
	p, efd, tok := parkerWithEventfd(t)
	var evs [4]unix.EpollEvent
	for round := range 10 {
		go func() {
			time.Sleep(5 * time.Millisecond)
			if err := AddCounter(efd); err != nil {
				t.Error(err)
			}
		}()
		start := time.Now()
		n, err := p.Wait(evs[:])
		if err != nil || n != 1 || EventToken(&evs[0]) != tok || evs[0].Events&unix.EPOLLIN == 0 {
			t.Fatalf("round %d: %d events (%+v), %v; want the eventfd's", round, n, evs[0], err)
		}
		if took := time.Since(start); took < 4*time.Millisecond {
			t.Fatalf("round %d: the wait returned after %v, before the event", round, took)
		}
		DrainCounter(efd)
	}
}

// Wait is the event loops' sleep: with events ready it allocates nothing.
func TestParkerAllocatesNothing(t *testing.T) {
	p, efd, _ := parkerWithEventfd(t)
	AddCounter(efd)
	var evs [4]unix.EpollEvent
	if a := testing.AllocsPerRun(200, func() { p.Wait(evs[:]) }); a != 0 {
		t.Fatalf("%v allocations per Wait, want 0", a)
	}
}

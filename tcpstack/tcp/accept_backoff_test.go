package tcp

import (
	"errors"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/test/testenv"
)

// listenerEvents waits (timeout ms) once and dispatches what epoll
// reports, returning how many events were for the listener.
func (h *tcpHarness) listenerEvents(timeout int) int {
	h.t.Helper()
	var evs [8]unix.EpollEvent
	n, err := h.poll.Wait(evs[:], timeout)
	if err != nil && !errors.Is(err, unix.EINTR) {
		h.t.Fatal(err)
	}
	lis := 0
	for i := 0; i < n; i++ {
		tok := hostsock.EventToken(&evs[i])
		if tok.Owner() == hostsock.OwnerTCPListener {
			lis++
		}
		h.tab.HandleSocketEvent(h.now, tok, evs[i].Events)
	}
	return lis
}

// TestAcceptBackoffAtFDLimit: at RLIMIT_NOFILE a forwarded port's accept
// fails with EMFILE and the connection stays in the backlog, which a
// level-triggered listener reports at every epoll_wait: the loop would
// spin. The listener must instead go quiet until its back-off timer or a
// closing connection, counted, and accept the connection once a
// descriptor is free.
func TestAcceptBackoffAtFDLimit(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	h.tab.SetGuest(h.guestMAC, h.guest.Addr(), netip.Addr{})
	h.dialForward(t, 8080) // waits in the listener's backlog

	restore := testenv.LimitFDs(t)
	if n := h.listenerEvents(2000); n != 1 {
		t.Fatalf("listener reported %d times, want once", n)
	}
	// Masked: however often the loop waits, the listener stays quiet.
	spins := 0
	for range 100 {
		spins += h.listenerEvents(0)
	}
	if spins != 0 {
		t.Fatalf("the listener was reported %d times in 100 epoll_waits while accept could not succeed (the loop spins)", spins)
	}
	if got := h.stats.AcceptBackoffs.Load(); got != 1 {
		t.Fatalf("AcceptBackoffs = %d after an accept at the descriptor limit, want 1", got)
	}
	retry := h.tab.NextTimer()
	if d := retry.Sub(h.now); d != acceptBackoffMin {
		t.Fatalf("retry in %v, want %v", d, acceptBackoffMin)
	}
	// The timer fires while still at the limit: retried, failed again,
	// masked again with the delay doubled.
	h.now = retry
	h.tab.Timers(h.now)
	if n := h.listenerEvents(2000); n != 1 || h.stats.AcceptBackoffs.Load() != 2 {
		t.Fatalf("after the back-off timer: %d listener events, %d back-offs; want 1 and 2", n, h.stats.AcceptBackoffs.Load())
	}
	if d := h.tab.NextTimer().Sub(h.now); d != 2*acceptBackoffMin {
		t.Fatalf("second retry in %v, want %v", d, 2*acceptBackoffMin)
	}
	if n := h.listenerEvents(0); n != 0 {
		t.Fatalf("listener reported %d times while masked again", n)
	}
	// A descriptor comes free, the timer fires: the connection is accepted
	// and the guest gets its SYN.
	restore()
	h.now = h.tab.NextTimer()
	h.tab.Timers(h.now)
	if n := h.listenerEvents(2000); n != 1 {
		t.Fatalf("listener reported %d times after the limit was lifted", n)
	}
	if h.stats.Accepted.Load() != 1 || h.stats.AcceptBackoffs.Load() != 2 {
		t.Fatalf("accepted %d, back-offs %d; want 1 and 2", h.stats.Accepted.Load(), h.stats.AcceptBackoffs.Load())
	}
	if syn := h.flush(); len(syn) != 1 || syn[0].flags != header.TCPFlagSYN || syn[0].dst.Port() != 8080 {
		t.Fatalf("no SYN to the guest after the accept: %+v", syn)
	}
}

// TestAcceptBackoffEndsWhenAConnectionCloses: a connection of the table
// closing frees a descriptor, so the masked listener is retried at once
// rather than at its timer.
func TestAcceptBackoffEndsWhenAConnectionCloses(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	h.tab.SetGuest(h.guestMAC, h.guest.Addr(), netip.Addr{})
	h.dialForward(t, 8080)
	if n := h.listenerEvents(2000); n != 1 || h.stats.Accepted.Load() != 1 {
		t.Fatalf("first connection: %d events, %d accepted", n, h.stats.Accepted.Load())
	}
	first := &h.tab.flows[h.tab.active[0]]
	h.flush() // its SYN
	// A second connection to the same port, waiting at the limit.
	h.dialForward(t, 8080)
	restore := testenv.LimitFDs(t)
	if n := h.listenerEvents(2000); n != 1 || h.stats.AcceptBackoffs.Load() != 1 {
		t.Fatalf("second connection at the limit: %d events, %d back-offs", n, h.stats.AcceptBackoffs.Load())
	}
	retry := h.tab.NextTimer()
	// The first connection goes (the guest resets it): its descriptor is
	// free, the listener is reported again before its timer.
	restore() // what the closed descriptor gives back, in a process with others free too
	h.tab.dropFlow(first, true)
	if n := h.listenerEvents(2000); n != 1 {
		t.Fatalf("listener reported %d times after a connection closed, want 1", n)
	}
	if h.stats.Accepted.Load() != 2 || !h.now.Before(retry) {
		t.Fatalf("accepted %d (want 2) before the timer at %v", h.stats.Accepted.Load(), retry)
	}
}

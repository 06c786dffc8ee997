package tcp

import (
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// The table's sockets in the running loop's epoll set: Attach and Detach
// follow the loop, updateEpoll asks for what a connection's state needs.

// Attach sets the poller and registers every open socket with it: the loop
// calls it after building a new epoll set (queue pair restart), so
// connections survive the control plane's ring rebuilds.
func (t *Table) Attach(p *hostsock.Epoll) {
	t.poll = p
	for _, s := range t.active {
		f := &t.flows[s]
		if f.fd < 0 || !f.inEpoll {
			continue
		}
		f.inEpoll = p.Add(f.fd, f.epollEvents, t.token(f)) == nil
	}
	// A new loop retries masked listeners at once.
	t.acceptRetry = time.Time{}
	for i := range t.listeners.All {
		l := &t.listeners.All[i]
		if l.fd < 0 {
			continue
		}
		l.masked = false
		if err := p.Add(l.fd, unix.EPOLLIN, t.listenerToken(i)); err != nil {
			t.log.Warn("tcp forward: epoll add failed", "err", err)
		}
	}
	// Changes decided after the last loop's final iteration.
	t.SyncEpoll()
}

// Detach forgets the poller: the loop calls it when it stops (its epoll set
// is closed with it, which drops every registration). Sockets stay open and
// Attach registers them with the next loop's set.
func (t *Table) Detach() { t.poll = nil }

// updateEpoll registers the events f's state calls for.
//
// Once connected, a socket is always watched edge-triggered. Data stays
// queued in the socket until the guest ACKs it, EOF and hang-up stay
// readable forever, and send space is often plentiful while the window we
// may advertise is not: level-triggered readiness would spin the loop in
// every one of those cases. Edges are enough because nothing here relies on
// epoll to be told twice: an output pass reads everything it has room for,
// and every other reason to stop reading has its own trigger (a guest ACK
// or window update, an RX refill, a timer), which reads directly.
//
// Reading follows DESIGN invariant 4: a flow stalled on the guest's window,
// or waiting for RX buffers, does not watch EPOLLIN at all; a flow stalled
// because everything readable is in flight watches it for new data.
//
// (Masking lazily, at the first readiness report during a stall, was
// measured under a QEMU download: data comes during nearly every stall,
// so it saved no epoll_ctl and doubled the wake-ups.)
//
// A registered socket's new mask waits for the end of the iteration
// (SyncEpoll), and only the last one counts. Under a QEMU guest's
// download nearly every iteration unmasked EPOLLIN for the guest's ACK,
// read, found the window full again and masked it: two epoll_ctl calls
// that left the mask as it was. Nothing is lost while a change waits: no
// event is taken before the loop's next wait, which comes after SyncEpoll;
// a read this iteration wants happens anyway (drained is cleared at once,
// as setEpoll would); and the epoll_ctl that unmasks reports what came
// meanwhile, as the kernel checks readiness on every modification.
func (t *Table) updateEpoll(f *conn) {
	if f.fd < 0 || t.poll == nil {
		return
	}
	want := t.epollWant(f)
	if want&unix.EPOLLIN != 0 && f.epollEvents&unix.EPOLLIN == 0 {
		// Data may have come while EPOLLIN was masked, unreported: this
		// iteration's output reads instead of trusting an earlier empty
		// read. (A read after this that empties the socket stands: what
		// comes after it, the registration reports.)
		f.drained = false
	}
	if !f.inEpoll {
		t.setEpoll(f, want)
		return
	}
	if !f.epollDue && want != f.epollEvents {
		f.epollDue = true
		t.epollQ = append(t.epollQ, f.ref())
	}
}

// SyncEpoll registers the masks the iteration's changes left (see
// updateEpoll). The loop calls it after its last output pass, before it
// waits again.
func (t *Table) SyncEpoll() {
	if t.poll == nil {
		return // Attach syncs
	}
	for _, r := range t.epollQ {
		f := t.deref(r)
		if f == nil || !f.epollDue {
			continue
		}
		f.epollDue = false
		if f.fd < 0 || !f.inEpoll {
			continue // closed or handed over: its registration went with it
		}
		t.setEpoll(f, t.epollWant(f))
	}
	t.epollQ = t.epollQ[:0]
}

// readPaused reports whether f reads nothing for now because of a stall
// on the guest's window or RX buffers.
func (t *Table) readPaused(f *conn) bool {
	return f.flags&flRxBlocked != 0 || f.flags&flStalled != 0 && f.flags&flWndStall != 0
}

// epollWant is the event mask f's state calls for.
func (t *Table) epollWant(f *conn) uint32 {
	var ev uint32
	switch {
	case f.flags&flConnected == 0:
		ev = unix.EPOLLOUT // connect() completion, once
	case f.state == stats.TCPSynSent:
		ev = unix.EPOLLET // the guest has not accepted yet: read once established
	case f.has(evGuestFinSent|evGuestFin) && f.inEpoll:
		// Both FINs are in: the guest's, and ours, sent after the host
		// socket's EOF was read (whichever came first). The one change
		// left is the socket's close, whose wake-up reports EPOLLHUP
		// under any mask. Masking EPOLLIN would keep out nothing: the
		// registration stays (one epoll_ctl less per connection the guest
		// closes), but for EPOLLOUT, which follows flWantOut as always.
		ev = f.epollEvents &^ unix.EPOLLOUT
	case f.has(evGuestFinSent):
		ev = unix.EPOLLET // nothing more to read; ERR and HUP are always reported
	case t.readPaused(f):
		ev = unix.EPOLLET
	default:
		ev = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLPRI | unix.EPOLLET
	}
	if f.flags&flWantOut != 0 {
		ev |= unix.EPOLLOUT
	}
	return ev
}

// setEpoll registers f's socket for ev, unless it already is.
func (t *Table) setEpoll(f *conn, ev uint32) {
	// EPOLLERR and EPOLLHUP are always reported; a zero mask still keeps the
	// fd registered for them.
	if f.inEpoll && f.epollEvents == ev {
		return
	}
	var err error
	t.epollCtls++
	if !f.inEpoll {
		err = t.poll.Add(f.fd, ev, t.token(f))
	} else {
		err = t.poll.Mod(f.fd, ev, t.token(f))
	}
	if err != nil {
		t.log.Debug("tcp epoll update failed", "fd", f.fd, "err", err)
		return
	}
	f.inEpoll = true
	f.epollEvents = ev
}

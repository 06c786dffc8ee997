package tcp

import (
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// Ending a connection: closing its host socket (with or without RST), and
// aborting it with an RST to the guest, counted by why.

// closeSocket removes f's socket from epoll and closes it; with reset the
// host peer sees RST.
//
// Closing the last descriptor of a socket takes it out of every epoll set
// (the kernel releases the file, and its registrations with it): a socket
// we made (connect, accept) and never handed over needs no EPOLL_CTL_DEL,
// one system call less per connection. One that was exported or imported
// has another descriptor, in another process or the TCP_REPAIR helper, that
// would keep it registered, reporting events for a descriptor number we
// may reuse: it is taken out first.
func (t *Table) closeSocket(f *conn, reset bool) {
	if f.fd < 0 {
		return
	}
	if f.inEpoll && t.poll != nil && !f.sole {
		t.epollCtls++
		_ = t.poll.Del(f.fd)
	}
	f.inEpoll = false
	f.epollEvents = 0
	if reset {
		hostsock.CloseWithReset(f.fd)
	} else {
		unix.Close(f.fd)
	}
	f.fd = -1
	if !t.acceptRetry.IsZero() {
		t.unmaskListeners() // a descriptor came free
	}
}

// resetFlow closes the host socket with RST and schedules an RST to the
// guest, counted by why; the slot is released once the RST is out.
func (t *Table) resetFlow(f *conn, now time.Time, why stats.TCPReason) {
	t.stats.Resets[why].Add(1)
	t.abortFlow(f, now)
}

// connectFailed ends a guest connection whose host connect() failed, as
// resetFlow does, counted as a connect failure.
func (t *Table) connectFailed(f *conn, now time.Time, why stats.TCPReason) {
	t.stats.ConnectFailures[why].Add(1)
	t.abortFlow(f, now)
}

// abortFlow closes the host socket with RST and schedules an RST to the
// guest; the slot is released once the RST is out.
func (t *Table) abortFlow(f *conn, now time.Time) {
	t.closeSocket(f, true)
	f.flags |= flRstDue
	f.lastActivity = now // the deadline for getting the RST out runs from here
	t.setState(f, stats.TCPResetting)
	t.markDirty(f)
	// If the guest has no RX buffer for the RST, the loop's timer must
	// still come for its deadline (deadline, TCPResetting).
	t.noteDeadline(f)
}

// dropFlow forgets f at once: no frame to the guest (it reset, or the
// connection finished cleanly).
func (t *Table) dropFlow(f *conn, reset bool) {
	t.closeSocket(f, reset)
	t.release(f)
}

package tcp

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// Back-off of forwarded-port listeners. A listener is level-triggered: a
// connection waiting in its backlog is reported by every epoll_wait until
// it is accepted. When accept fails for want of a descriptor (EMFILE at
// RLIMIT_NOFILE, ENFILE) or of memory, the connection stays in the backlog,
// so without a back-off the loop would spin on that one event at full CPU
// and starve every flow of the pair. Instead the listener leaves the epoll
// set's interest until a connection of the table closes (a descriptor came
// free) or a timer fires (a descriptor may have come free elsewhere),
// whichever is first; the timer's delay doubles while accept keeps failing.

const (
	acceptBackoffMin = 50 * time.Millisecond
	acceptBackoffMax = time.Second
)

// acceptExhausted reports errors of accept that say the process or the
// system is out of a resource rather than that this connection failed.
func acceptExhausted(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) ||
		errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM)
}

// backOffAccept masks listener i after accept failed with err (see
// acceptExhausted) and sets the time the masked listeners are retried.
func (t *Table) backOffAccept(now time.Time, i int, err error) {
	t.stats.AcceptBackoffs.Add(1)
	l := &t.listeners.All[i]
	if !l.masked && t.poll != nil {
		// Zero events: still registered, not reported (a listener has no
		// ERR or HUP to report).
		if merr := t.poll.Mod(l.fd, 0, t.listenerToken(i)); merr != nil {
			t.log.Debug("tcp forward: mask listener", "err", merr)
		}
	}
	l.masked = true
	t.acceptDelay = min(max(2*t.acceptDelay, acceptBackoffMin), acceptBackoffMax)
	t.acceptRetry = now.Add(t.acceptDelay)
	t.noteTimer(t.acceptRetry)
	if ok, held := t.acceptLog.Allow(now, time.Second); ok {
		t.log.Warn("tcp forward: accept failed, listener paused", "err", err, "retry_in", t.acceptDelay, "held_back", held)
	}
}

// unmaskListeners lets the masked listeners report their backlog again:
// the next epoll_wait retries the accept.
func (t *Table) unmaskListeners() {
	t.acceptRetry = time.Time{}
	for i := range t.listeners.All {
		l := &t.listeners.All[i]
		if !l.masked || l.fd < 0 {
			continue
		}
		l.masked = false
		if t.poll != nil {
			if err := t.poll.Mod(l.fd, unix.EPOLLIN, t.listenerToken(i)); err != nil {
				t.log.Warn("tcp forward: unmask listener", "err", err)
			}
		}
	}
}

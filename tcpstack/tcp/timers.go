package tcp

import (
	"math"
	"time"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// Timers: every deadline is computed from timestamps kept per connection.

// deadline returns when f's next timer fires; zero for none.
func (t *Table) deadline(f *conn) time.Time {
	switch f.state {
	case stats.TCPFree:
		return time.Time{}
	case stats.TCPConnecting:
		return f.created.Add(t.cfg.HandshakeTimeout)
	case stats.TCPSynAckSent:
		d := f.created.Add(t.cfg.HandshakeTimeout)
		if f.flags&flSynAckDue == 0 {
			d = earliest(d, f.lastAckProg.Add(synAckTimeout(f)))
		}
		return d
	case stats.TCPSynSent:
		// Our SYN is repeated every AckTimeout until the handshake times out.
		return earliest(f.created.Add(t.cfg.HandshakeTimeout), f.lastAckProg.Add(t.cfg.AckTimeout))
	case stats.TCPResetting:
		// Waiting for an RX buffer for the RST since the reset
		// (lastActivity, no longer moved); give up eventually.
		return f.lastActivity.Add(t.cfg.FinTimeout)
	}
	d := f.lastActivity.Add(t.quietTimeout(f))
	if f.inFlight() > 0 {
		d = earliest(d, f.lastAckProg.Add(t.ackTimeout(f)))
		if t.tlpArmed(f) {
			d = earliest(d, f.lastAckProg.Add(t.pto(f)))
		}
	} else if zeroWindow(f) {
		d = earliest(d, f.lastAckProg.Add(t.probeTimeout(f)))
	}
	return earliest(earliest(d, f.ackDueAt), f.delAckAt)
}

// quietTimeout is how long f may go without activity before it is reset.
// A half-closed connection is still a connection (one side may keep
// sending, or both may wait): it gets the idle timeout. The FIN timeout is
// for the end of a close: both FINs exchanged, or our FIN waiting for the
// guest's ACK.
func (t *Table) quietTimeout(f *conn) time.Duration {
	if f.state == stats.TCPClosing && f.finWentOut() && (f.has(evGuestFin) || !f.has(evGuestFinAck)) {
		return t.cfg.FinTimeout
	}
	return t.cfg.IdleTimeout
}

// synAckRTO is the first retransmission timeout of a SYN-ACK to the
// guest: RFC 6298's initial RTO (no round trip measured yet), as Linux
// retransmits its own SYN-ACK.
const synAckRTO = time.Second

// synAckMaxBackoff bounds the doublings of synAckRTO (the handshake
// timeout ends the connection first with the defaults).
const synAckMaxBackoff = 6

// synAckTimeout is how long after the last SYN-ACK the next one goes.
func synAckTimeout(f *conn) time.Duration { return synAckRTO << f.retrans }

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// Timers fires the connection timers due at now (handshake, ACK timeout
// with exponential backoff, delayed ACK checks, FIN and idle timeouts) and
// returns the next deadline (zero: none). Every timer is computed from
// explicit timestamps kept per connection, so it can be tested with any
// clock.
func (t *Table) Timers(now time.Time) (next time.Time) {
	if !t.acceptRetry.IsZero() {
		if t.acceptRetry.After(now) {
			next = t.acceptRetry
		} else {
			t.unmaskListeners()
		}
	}
	owner := int32(-1)
	note := func(f *conn, d time.Time) {
		if !d.IsZero() && (next.IsZero() || d.Before(next)) {
			next, owner = d, f.slot
		}
	}
	// Backwards: release swaps the last active slot into the freed place,
	// which has already been visited.
	for i := len(t.active) - 1; i >= 0; i-- {
		if i >= len(t.active) {
			continue
		}
		f := &t.flows[t.active[i]]
		d := t.deadline(f)
		if d.IsZero() || d.After(now) {
			note(f, d)
			continue
		}
		t.fire(now, f)
		if f.state != stats.TCPFree {
			note(f, t.deadline(f))
		}
	}
	t.nextTimer, t.timerOwner, t.timerStale = next, owner, false
	return next
}

// fire handles f's expired timers.
func (t *Table) fire(now time.Time, f *conn) {
	switch f.state {
	case stats.TCPSynSent:
		if f.created.Add(t.cfg.HandshakeTimeout).After(now) {
			f.flags |= flSynDue
			f.lastAckProg = now
			t.markDirty(f)
			return
		}
		t.log.Debug("tcp handshake timeout (forwarded)", "remote", f.remoteAddr, "port", f.remotePort)
		t.resetFlow(f, now, stats.TCPTimeout)
		return
	case stats.TCPConnecting, stats.TCPSynAckSent:
		if f.state == stats.TCPSynAckSent && f.created.Add(t.cfg.HandshakeTimeout).After(now) {
			// The SYN-ACK or the guest's ACK of it was lost: a guest that
			// only receives sends nothing else, and the host peer's data
			// waits for the handshake. Send it again (the guest answers a
			// repeated SYN-ACK with its ACK), backing off.
			f.flags |= flSynAckDue
			f.retrans = min(f.retrans+1, synAckMaxBackoff)
			t.stats.Retransmits[stats.TCPRetransTimeout].Add(1)
			t.markDirty(f)
			return
		}
		t.log.Debug("tcp handshake timeout", "remote", f.remoteAddr, "port", f.remotePort)
		if f.state == stats.TCPConnecting {
			t.connectFailed(f, now, stats.TCPTimeout)
		} else {
			t.resetFlow(f, now, stats.TCPTimeout)
		}
		return
	case stats.TCPResetting:
		t.release(f) // the RST never found a buffer
		return
	}
	if !f.delAckAt.IsZero() && !f.delAckAt.After(now) {
		t.delayedAckDue(f)
	}
	if !f.ackDueAt.IsZero() && !f.ackDueAt.After(now) {
		// Only a look: an ACK that repeats the last one is a duplicate
		// ACK to the guest, and a guest without SACK retransmits on it.
		f.ackDueAt = time.Time{}
		f.flags |= flAckCheck
		t.markDirty(f)
	}
	if t.tlpArmed(f) && !f.lastAckProg.Add(t.pto(f)).After(now) {
		f.tlp = tlpDue
		t.markDirty(f)
	}
	if f.inFlight() > 0 && !f.lastAckProg.Add(t.ackTimeout(f)).After(now) {
		// A guest that answered the last resend with a shut window
		// (flZeroWnd: set by its ACK, cleared by every rewind) is alive,
		// only short of memory: it dropped what we sent (input.go). Its
		// resends go on, backed off, as zero-window probes would, one
		// segment each (the window we last knew stands for the rest);
		// only silence counts against the connection. As with a kernel's
		// persist timer, a guest that keeps answering keeps it.
		zeroWnd := f.flags&flZeroWnd != 0
		if int(f.retrans) >= t.maxRetrans(f) && !zeroWnd {
			t.log.Debug("tcp retransmissions exceeded", "remote", f.remoteAddr, "port", f.remotePort)
			t.resetFlow(f, now, stats.TCPTimeout)
			return
		}
		if f.retrans < math.MaxUint8 {
			f.retrans++
		}
		if zeroWnd && f.mssToGuest > 0 {
			f.wndFromGuest = min(f.wndFromGuest, uint32(f.mssToGuest))
		}
		f.lastAckProg = now
		t.rewind(now, f, stats.TCPRetransTimeout)
	}
	if zeroWindow(f) && !f.lastAckProg.Add(t.probeTimeout(f)).After(now) {
		// Probe the shut window, backing off as the ACK timeout does but
		// with no limit: a guest may keep its window shut for as long as
		// it likes; only its silence (the idle timeout) ends it. The
		// probe is sent only if there is something to offer: data, or
		// the peer's FIN.
		f.lastAckProg = now
		if f.retrans < math.MaxUint8 {
			f.retrans++
		}
		if hostsock.Readable(f.fd) > 0 || t.peerFinPending(f) {
			f.flags |= flProbeDue
			t.markDirty(f)
		}
	}
	if !f.lastActivity.Add(t.quietTimeout(f)).After(now) {
		t.log.Debug("tcp idle timeout", "remote", f.remoteAddr, "port", f.remotePort, "closing", f.state == stats.TCPClosing)
		t.resetFlow(f, now, stats.TCPTimeout)
	}
}

// Linux TCP states (include/net/tcp_states.h) in which the peer's FIN has
// arrived.
const (
	tcpStateTimeWait  = 6
	tcpStateCloseWait = 8
	tcpStateLastAck   = 9
	tcpStateClosing   = 11
)

// peerFinPending reports whether f's host peer closed its side and our FIN
// for it has not gone to the guest. SIOCINQ does not count a FIN, and with
// the window shut nothing reads the socket to find its end; EPOLLRDHUP
// may have come while the socket's events were masked, so the socket's
// state is asked (one TCP_INFO per probe interval).
func (t *Table) peerFinPending(f *conn) bool {
	if f.has(evGuestFinSent) {
		return false
	}
	if f.has(evSockRdHup) || f.has(evSockFin) {
		return true
	}
	info := t.readInfo(f)
	if info == nil {
		return false
	}
	switch info.State {
	case tcpStateTimeWait, tcpStateCloseWait, tcpStateLastAck, tcpStateClosing:
		return true
	}
	return false
}

// zeroWindow reports whether f waits on a window the guest shut with
// nothing in flight: only the guest's window update reopens it, and if that
// is lost nothing would, so the window is probed (RFC 9293 3.8.6.1).
func zeroWindow(f *conn) bool {
	return f.wndFromGuest == 0 && f.inFlight() == 0 && f.fd >= 0 &&
		(f.state == stats.TCPEstablished || f.state == stats.TCPClosing) && !f.has(evGuestFinSent)
}

// maxAckTimeout caps the backed-off ACK timeout.
const maxAckTimeout = time.Minute

// finWentOut reports whether our FIN has gone to the guest at least once.
// evGuestFinSent does not say it: a rewind clears it until the FIN goes
// again; a sequence past the end of the stream does.
func (f *conn) finWentOut() bool { return f.has(evSockFin) && seqGT(f.sndMax, f.eofSeq) }

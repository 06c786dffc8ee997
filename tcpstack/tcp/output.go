package tcp

import (
	"time"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
)

// Flush runs the output pass: every connection with something due (data
// from its socket, SYN-ACK, ACK, window update, FIN, RST) writes it through
// w, in that order per connection (DESIGN invariant 2: one ordered output,
// so a flag never overtakes data). The loop calls it once per iteration
// after handling TX frames, socket events and timers, and again when the
// guest posts RX buffers. blocked reports that the guest's RX ring ran out:
// the unserved connections stay queued, and the loop must call Flush again
// when buffers arrive (enable RX kicks); no timer is involved.
func (t *Table) Flush(now time.Time, w guestring.Sink) (blocked bool) {
	// A TCP_INFO kept for a SYN-ACK lasts this pass at most.
	defer t.dropConnectInfo()
	if t.nrst > 0 && !t.flushRSTs(w) {
		return true
	}
	// Flows queued during this pass (a reset, say) are served in it too,
	// but a flow blocked on descriptors ends the pass.
	for t.outHead >= 0 {
		s := t.outHead
		f := &t.flows[s]
		t.outHead = f.nextOut
		if t.outHead < 0 {
			t.outTail = -1
		}
		f.nextOut = -1
		f.flags &^= flDirty
		if f.state == stats.TCPFree {
			t.free = append(t.free, s) // released while queued
			continue
		}
		if !t.output(now, f, w) {
			// Requeue at the tail: the next pass serves the others first.
			// What output did before it blocked may have moved f's
			// deadline (an ACK now due, say).
			t.markDirty(f)
			if f.state != stats.TCPFree {
				t.noteDeadline(f)
			}
			return true
		}
		if f.state != stats.TCPFree {
			t.noteDeadline(f)
		}
	}
	return false
}

// output writes everything due for f. It returns false when the guest had
// no RX buffer for something that was due.
func (t *Table) output(now time.Time, f *conn, w guestring.Sink) bool {
	if f.oooReady() && f.flags&flOutArmed == 0 {
		// Data kept past a filled hole that a full socket held back: the
		// guest has it SACKed and will not send it again (outoforder.go).
		// Not while the socket is known full: EPOLLOUT clears flOutArmed
		// and brings us back, a sendmsg before it only fails with EAGAIN.
		t.writeOutOfOrder(now, f)
	}
	if f.flags&flRstDue != 0 {
		// At the highest sequence sent, not seqToGuest, which a rewind
		// moved back: the guest may have everything up to sndMax, and an
		// RST below its next expected byte would be dropped; one above it
		// but in its window gets a challenge ACK, and our stateless RST
		// to that carries its exact ACK.
		if !t.sendFlags(f, w, header.TCPFlagRST|header.TCPFlagACK, f.sndMax) {
			return false
		}
		t.stats.RSTSent.Add(1)
		t.release(f)
		return true
	}
	switch f.state {
	case stats.TCPConnecting:
		return true
	case stats.TCPSynSent:
		if f.flags&flSynDue == 0 {
			return true
		}
		t.refreshAckWnd(now, f)
		if !t.sendFlags(f, w, header.TCPFlagSYN, f.iss) {
			return false
		}
		f.flags &^= flSynDue
		f.seqToGuest = f.iss + 1
		f.sndMax = f.seqToGuest
		return true
	case stats.TCPSynAckSent:
		if f.flags&flSynAckDue == 0 {
			return true
		}
		t.refreshAckWnd(now, f)
		if !t.sendFlags(f, w, header.TCPFlagSYN|header.TCPFlagACK, f.iss) {
			return false
		}
		f.flags &^= flSynAckDue
		f.seqToGuest = f.iss + 1
		f.sndMax = f.seqToGuest
		f.lastAckProg = now // the SYN-ACK's retransmission timer runs from here
		return true
	}
	if !t.ackWndCurrent(now, f) && !t.wndHolds(now, f) {
		t.refreshAckWnd(now, f)
	}
	if f.sackRecovery && !t.resendHoles(now, f, w) {
		return false
	}
	if f.tlp == tlpDue && !t.sendTailProbe(now, f, w) {
		return false
	}
	if f.flags&flRstDue != 0 {
		return true // a resend reset it: the RST goes when the queue comes back to it
	}
	if !t.sendData(now, f, w) {
		return false
	}
	if f.has(evSockFin) && !f.has(evGuestFinSent) && f.seqToGuest == f.eofSeq && f.fd >= 0 {
		if !t.sendFlags(f, w, header.TCPFlagFIN|header.TCPFlagACK, f.seqToGuest) {
			return false
		}
		if f.inFlight() == 0 {
			f.lastAckProg = now
		}
		f.seqToGuest++
		f.sndMax = seqMax(f.sndMax, f.seqToGuest)
		f.events |= evGuestFinSent
		t.setState(f, stats.TCPClosing)
		t.updateEpoll(f)
	}
	if f.flags&flProbeDue != 0 {
		// A zero-window probe: an ACK one below the next sequence, which
		// the guest answers with its window (RFC 9293 3.8.6.1; Linux
		// probes the same way). The guest drops it as an old segment
		// before it reads its ACK field, so an ACK due or held goes first
		// in a frame of its own: the probe would count it as sent.
		if f.flags&flAckDue != 0 || f.seqAckToGuest != f.ackSent {
			if !t.sendFlags(f, w, header.TCPFlagACK, f.seqToGuest) {
				return false
			}
		}
		if !t.sendFlags(f, w, header.TCPFlagACK, f.seqToGuest-1) {
			return false
		}
		f.flags &^= flProbeDue
		t.stats.WindowProbes.Add(1)
	}
	check := f.flags&flAckCheck != 0
	f.flags &^= flAckCheck
	// A held ACK goes now if the connection ends in this pass: nothing
	// would carry it after.
	closed := f.has(evGuestFin | evGuestFinSent | evGuestFinAck)
	if f.flags&flAckDue != 0 || (f.seqAckToGuest != f.ackSent && (!f.ackHeld(now) || closed)) || t.windowUpdateDue(f) {
		if !t.sendFlags(f, w, header.TCPFlagACK, f.seqToGuest) {
			return false
		}
		f.ackCheckIvl = 0
	} else if check && !f.ackDueAt.IsZero() && f.seqAckToGuest == f.ackSent {
		// The check found nothing new (an ACK that moved but is held
		// for a frame to carry it is new): look again, less and less
		// often.
		f.ackCheckIvl = min(2*max(f.ackCheckIvl, t.cfg.AckInterval), max(ackCheckMax, t.cfg.AckInterval))
		f.ackDueAt = now.Add(f.ackCheckIvl)
	}
	for ; f.dupAcksDue > 0; f.dupAcksDue-- {
		if !t.sendFlags(f, w, header.TCPFlagACK, f.seqToGuest) {
			return false
		}
	}
	if closed {
		// Both directions are closed and acknowledged: done.
		t.dropFlow(f, false)
	}
	return true
}

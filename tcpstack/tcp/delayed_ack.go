package tcp

import "time"

// Delayed ACKs towards the guest.
//
// Every frame to the guest costs it an interrupt and a pass through its
// stack, which a TCG guest pays in hundreds of microseconds, and costs us
// the wake-up of the front-end that raises the interrupt. An ACK for guest
// data sent at once is a frame of its own; the host's answer, when it
// comes a few microseconds later, is a second. So, as a receiving TCP
// does (RFC 9293 3.8.6.3, RFC 5681 4.2), the ACK for in-order data waits
// up to Config.DelayedAck for a frame to carry it: the answer's first
// segment (sendData), or any other frame with ACK set. It goes at once
// when waiting could slow the guest down:
//   - more than a full segment is unacknowledged, so at least every
//     second full-sized segment is acknowledged;
//   - the guest has used half the window we last gave it;
//   - the data filled a hole (data was kept out of order, or it is at the
//     sequence our duplicate ACKs named), or the socket took only part of
//     it: the guest must hear where we are;
//   - everything that already asks for an ACK at once (keep-alive,
//     retransmissions, gaps, challenges) sets flAckDue itself. The ACK of
//     a FIN waits too (ackGuestFin), for our FIN.
//
// Two kinds of connection do not wait:
//   - those whose ACKs follow a remote peer's (acksFollowPeer): their ACK
//     moves when the peer's does, a round trip after the data, so an
//     answer rarely carries it; they keep the delayed-ACK check of
//     refreshAckWnd;
//   - for a spell, one whose guest waited for a delayed ACK (delAckOff).
//     A guest that waits for our ACK before it sends more — Nagle's
//     algorithm holding a second small write, or the last frames of a
//     window — would lose the delay on every exchange (Linux's 40 ms
//     delayed ACK does that to a write-write-read client). When a delayed
//     ACK goes uncarried, the connection's ACKs go at once until we learn
//     why: more guest data first means the guest was waiting for it, and
//     they keep going at once for a spell; the host's answer first means
//     the answer was only slow, and delaying resumes. The spell lasts two
//     exchanges (a turn of guest data, then host data to the guest,
//     however many frames either takes: delAckTurn), and twice as many
//     each time the guest is found waiting again (at most
//     delAckSpellMax). A write-write-read client pays the delay a handful
//     of times, then once in delAckSpellMax exchanges; a connection whose
//     first message went unanswered by design (a greeting or a header,
//     then requests: the QEMU bench's RR client) is not kept from
//     delaying for the rest of its life, which had cost a TCG guest a
//     second frame, our ACK before the answer, on every exchange.
//
// Under a QEMU guest a 1-byte request and its answer were two frames to
// the guest (our ACK, then the answer) and are now one. The TCG guest's
// median round trip is shorter for it: over six interleaved rounds of
// the QEMU bench's RR check (3 s each), p50 was 347-641 µs (median 365)
// with the delay and 372-451 µs (median 432) with every ACK at once.

// defaultDelayedAck is Config.DelayedAck's default: far above the time a
// host peer on this machine takes to answer, far below the guest's
// retransmission timeout (200 ms at least), and a tenth of passt's
// ACK_INTERVAL.
const defaultDelayedAck = time.Millisecond

// ackGuestData schedules the ACK for guest data just written to f's socket
// (fully when whole is true; filledHole: the data filled a hole).
func (t *Table) ackGuestData(now time.Time, f *conn, whole, filledHole bool) {
	// Data after an uncarried delayed ACK, before any answer: the guest
	// waited for that ACK. ACKs go at once for a spell, longer each time.
	if f.delAckProbe {
		f.delAckProbe = false
		f.delAckSpell = min(max(2*f.delAckSpell, delAckSpellMin), delAckSpellMax)
		f.delAckRetry = f.delAckSpell
	}
	f.delAckTurn = true
	unacked := f.seqFromGuest - f.ackSent
	t.scheduleAck(now, f, f.delAckOff || !whole || filledHole || unacked > f.guestMSS() || 2*unacked >= f.wndSent)
}

// ackGuestFin schedules the ACK for the guest's FIN. While the host side
// is open it waits like a data ACK: the peer, reading the end of the
// stream we just gave it, usually closes within microseconds, and our FIN
// carries the ACK — one frame to the guest where there were two (Linux
// delays the ACK of a FIN for the same reason). It goes at once where our
// FIN went already (this one answers it, and nothing else is to come) and
// where ACKs follow a remote peer, whose FIN is a round trip away.
func (t *Table) ackGuestFin(now time.Time, f *conn) {
	t.markDirty(f) // the ACK number moved: the next pass refreshes it
	t.scheduleAck(now, f, f.fd < 0 || f.finWentOut())
}

// scheduleAck sends f's ACK in the next output pass when atOnce, when
// delaying is off, or when f's ACKs follow a remote peer's; otherwise it
// waits up to Config.DelayedAck for a frame to carry it (a wait already
// running is not extended).
func (t *Table) scheduleAck(now time.Time, f *conn, atOnce bool) {
	if atOnce || t.cfg.DelayedAck < 0 || t.acksFollowPeer(f) {
		f.flags |= flAckDue
		t.markDirty(f)
		return
	}
	if f.delAckAt.IsZero() {
		f.delAckAt = now.Add(t.cfg.DelayedAck)
		t.noteDeadline(f)
	}
}

// delayedAckDue sends the ACK no frame carried within the delay; f's ACKs
// go at once until what comes next tells whether the guest waited for it.
func (t *Table) delayedAckDue(f *conn) {
	f.delAckAt = time.Time{}
	f.delAckOff, f.delAckProbe = true, true
	f.flags |= flAckDue
	t.markDirty(f)
}

// Bounds of an at-once spell, in exchanges.
const (
	delAckSpellMin = 2
	delAckSpellMax = 256
)

// answered notes host data sent to the guest with an ACK. After an
// uncarried delayed ACK and before more guest data, the answer was slow,
// and ACKs may wait again; during an at-once spell, the first frame of
// data after guest data ends an exchange, and counts towards the spell's
// end (the answer's other frames, and resends, do not).
func (f *conn) answered() {
	switch {
	case f.delAckProbe:
		f.delAckOff, f.delAckProbe = false, false
	case f.delAckOff && f.delAckRetry > 0 && f.delAckTurn:
		f.delAckTurn = false
		f.delAckRetry--
		if f.delAckRetry == 0 {
			f.delAckOff = false
		}
	}
}

// ackHeld reports whether a change of the ACK number waits for a frame to
// carry it.
func (f *conn) ackHeld(now time.Time) bool {
	return !f.delAckAt.IsZero() && now.Before(f.delAckAt)
}

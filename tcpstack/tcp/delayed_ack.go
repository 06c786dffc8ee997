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
//   - the data filled a hole (data was kept out of order), or the socket
//     took only part of it: the guest must hear where we are;
//   - everything that already asks for an ACK at once (FIN, keep-alive,
//     retransmissions, gaps, challenges) sets flAckDue itself.
//
// Under a QEMU guest a 1-byte request and its answer were two frames to
// the guest (our ACK, then the answer) and are now one.

// defaultDelayedAck is Config.DelayedAck's default: far above the time a
// host peer on this machine takes to answer, far below the guest's
// retransmission timeout (200 ms at least), and a tenth of passt's
// ACK_INTERVAL.
const defaultDelayedAck = time.Millisecond

// ackGuestData schedules the ACK for guest data just written to f's socket
// (fully when whole is true).
func (t *Table) ackGuestData(now time.Time, f *conn, whole, filledHole bool) {
	unacked := f.seqFromGuest - f.ackSent
	if t.cfg.DelayedAck < 0 || !whole || filledHole || unacked > f.guestMSS() || 2*unacked >= f.wndSent {
		f.flags |= flAckDue
		t.markDirty(f)
		return
	}
	if f.delAckAt.IsZero() {
		f.delAckAt = now.Add(t.cfg.DelayedAck)
		t.noteTimer(f.delAckAt)
	}
}

// ackHeld reports whether a change of the ACK number waits for a frame to
// carry it.
func (f *conn) ackHeld(now time.Time) bool {
	return !f.delAckAt.IsZero() && now.Before(f.delAckAt)
}

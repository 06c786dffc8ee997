package tcp

import (
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
)

// Loss recovery towards a guest that negotiated SACK: frames lost (or held
// back, or duplicated) between our RX ring and the guest's TCP are found
// from the guest's SACK blocks and only the holes go again, peeked at their
// offset from the guest's ACK (the data is still in the socket: DESIGN
// invariant 3); seqToGuest does not move (invariant 1: it still names the
// next new byte, and everything below it was committed once).
//
// Why not the duplicate-ACK rule of a guest without SACK (input.go: a
// repeated ACK with an unchanged window, then a rewind that sends the whole
// flight again): a Linux receiver with SACK grows its window as
// out-of-order data arrives (tcp_data_queue_ofo, tcp_grow_window), so its
// duplicate ACKs mostly carry a new window and never counted; only the ACK
// timeout recovered, seconds per loss. Here (RFC 6675, simplified) an ACK
// that repeats the ACK number and SACKs more than before is a duplicate,
// whatever its window; the third starts a recovery (at once when nothing
// more can be sent, so no more duplicates can come: RFC 5827's early
// retransmit), which ends when the guest's ACK reaches the highest
// sequence sent when it began. A hole sent again and lost again is found
// the same way: three more ACKs SACKing data sent after it, the hole
// still open. The ACK timeout (timers.go) remains the backstop.

// sackMaxBlocks is how many SACK blocks an ACK carries at most.
const sackMaxBlocks = header.TCPMaxSACKBlocks

// dupAcksToRetransmit is how many duplicate ACKs with new SACK information
// start a recovery (RFC 6675's DupThresh, Linux's default reordering).
const dupAcksToRetransmit = 3

// sackView is one guest ACK's SACK blocks about data in flight.
type sackView struct {
	blk  [sackMaxBlocks]seqRange // sorted by start, disjoint, not adjacent
	n    int
	high uint32 // the highest end
}

// readGuestSACK reads the SACK blocks of sg, an ACK from the guest, into
// t.sackIn: only those within (ack, sndMax] (a D-SACK block, below the ACK,
// reports a duplicate and says nothing about holes). It reports whether any
// block was left.
func (t *Table) readGuestSACK(f *conn, sg *segment) bool {
	v := &t.sackIn
	v.n = 0
	o := &sg.opts
	*o = header.TCPOptions{}
	// A malformed option list leaves the blocks decoded before it.
	_ = header.ParseTCPOptions(sg.rawOpts, o)
	for i := 0; i < o.NumSACKBlocks; i++ {
		r := seqRange{o.SACKBlocks[i].Start, o.SACKBlocks[i].End}
		if !seqGT(r.end, r.start) || !seqGT(r.start, sg.ack) || seqGT(r.end, f.sndMax) {
			continue
		}
		v.add(r)
	}
	if v.n == 0 {
		return false
	}
	v.high = v.blk[v.n-1].end
	return true
}

// add inserts r, merging it with the blocks it overlaps or touches (an
// ACK carries at most len(v.blk) blocks: they always fit).
func (v *sackView) add(r seqRange) {
	var out [sackMaxBlocks + 1]seqRange
	n := 0
	for _, b := range v.blk[:v.n] {
		switch {
		case seqLT(b.end, r.start):
			out[n] = b
			n++
		case seqLT(r.end, b.start):
			out[n], r = r, b // r goes before b; b is carried on
			n++
		default: // overlapping or adjacent: r takes b in
			if seqLT(b.start, r.start) {
				r.start = b.start
			}
			r.end = seqMax(r.end, b.end)
		}
	}
	out[n] = r
	v.n = copy(v.blk[:], out[:n+1])
}

// sackedHigh returns the highest sequence the guest SACKed, if it is still
// in flight (a new connection's zero, a hand-over's, or one the ACK passed
// means nothing).
func (f *conn) sackedHigh() (uint32, bool) {
	return f.sackHigh, seqGT(f.sackHigh, f.seqAckFromGuest) && !seqGT(f.sackHigh, f.sndMax)
}

// keepSACK stores the blocks of t.sackIn as f's view of what the guest has.
func (t *Table) keepSACK(f *conn) {
	v := &t.sackIn
	f.sackN = uint8(copy(f.sackBlk[:], v.blk[:v.n]))
	if high, ok := f.sackedHigh(); !ok || seqGT(v.high, high) {
		f.sackHigh = v.high
	}
}

// sackDupAck handles an ACK from the guest that repeats its ACK number
// with SACK blocks (t.sackIn) while data is in flight.
func (t *Table) sackDupAck(f *conn) {
	una := f.seqAckFromGuest
	v := &t.sackIn
	if high, ok := f.sackedHigh(); ok && !seqGT(v.high, high) {
		// Nothing SACKed that was not before: an echo of a duplicate
		// frame, or a window update.
		return
	}
	t.keepSACK(f)
	if f.seqToGuest != f.sndMax {
		// A rewind is sending everything from the ACK again, the holes
		// with it.
		return
	}
	if f.dupAcks < 0xff {
		f.dupAcks++
	}
	// Nothing more to send and the guest has all after the hole: no more
	// duplicates will come to count. With our FIN in flight the guest has
	// all after the hole once it SACKed to the data's end, or past it: a
	// Linux receiver SACKs an out-of-order FIN too (its block's end counts
	// the FIN), and then no later SACK moves the edge.
	dataEnd := f.sndMax
	if f.has(evSockFin) && seqGT(dataEnd, f.eofSeq) {
		dataEnd = f.eofSeq
	}
	early := !seqLT(v.high, dataEnd) && f.sendsNothing()
	switch {
	case !f.sackRecovery:
		if f.dupAcks < dupAcksToRetransmit && !early {
			return
		}
		f.sackRecovery = true
		f.recover = f.sndMax
		f.rtxNext = una
	case seqGT(v.high, f.rtxMark) && seqGT(f.rtxNext, una):
		// Data sent after the hole at the ACK went again has arrived, and
		// that hole is still open: the resend was lost too.
		if f.dupAcks < dupAcksToRetransmit && !early {
			return
		}
		f.rtxNext = una
	default:
		// Recovering: the new blocks may show holes past rtxNext.
		f.dupAcks = 0
		t.markDirty(f)
		return
	}
	f.dupAcks = 0
	t.stats.Retransmits[stats.TCPRetransSACK].Add(1)
	t.markDirty(f)
}

// sackAckProgress updates a recovery on an ACK that moved the guest's ACK
// number (f.seqAckFromGuest already is it); sack says whether t.sackIn holds
// the ACK's blocks.
func (t *Table) sackAckProgress(f *conn, sack bool) {
	if !f.sackRecovery {
		return
	}
	if !seqLT(f.seqAckFromGuest, f.recover) {
		// Everything in flight when the recovery began is acknowledged.
		f.sackRecovery = false
		f.sackN = 0
		return
	}
	// A partial ACK: the guest has the hole at the old ACK now; the
	// resends past it are still on their way, the holes after them follow.
	f.rtxNext = seqMax(f.rtxNext, f.seqAckFromGuest)
	if sack {
		t.keepSACK(f)
	}
}

// endSACKRecovery forgets a recovery and what the guest SACKed: a rewind
// sends everything from the guest's ACK again.
func (f *conn) endSACKRecovery() {
	f.sackRecovery = false
	f.sackN = 0
	f.sackHigh = f.seqAckFromGuest
}

// sendsNothing reports whether the last output pass left f with nothing
// more to send: the guest's window is full or all socket data is in flight
// (STALLED), the socket was emptied and no EPOLLIN came since (drained,
// syscall_hints.go), or it reached its EOF: all its data and our FIN went.
func (f *conn) sendsNothing() bool {
	return f.flags&flStalled != 0 || f.drained || f.has(evSockFin)
}

// nextHole returns the first range in flight that the guest is missing
// below what it SACKed and that did not go again yet.
func (f *conn) nextHole() (from, end uint32, ok bool) {
	cur := seqMax(f.seqAckFromGuest, f.rtxNext)
	for _, b := range f.sackBlk[:f.sackN] {
		if seqLT(cur, b.start) {
			return cur, b.start, true
		}
		cur = seqMax(cur, b.end)
	}
	return 0, 0, false
}

// resendHoles sends the holes of a SACK recovery again, in the output pass
// before new data (one ordered output: DESIGN invariant 2). It returns
// false when the guest ran out of RX buffers; the next pass goes on from
// rtxNext.
func (t *Table) resendHoles(now time.Time, f *conn, w guestring.Sink) bool {
	for f.sackRecovery && f.fd >= 0 {
		from, end, ok := f.nextHole()
		if !ok {
			return true
		}
		reached, ok := t.resend(now, f, w, from, end)
		if reached != from {
			if from == f.seqAckFromGuest {
				// What is sent after this is what shows it lost.
				f.rtxMark = f.sndMax
			}
			f.rtxNext = reached
		}
		if !ok {
			return false
		}
		if reached == from {
			return true // nothing came (or f was reset): do not spin
		}
	}
	return true
}

// resend peeks [from, end), data sent before and still unacknowledged, into
// guest buffers as one or more frames at their own sequence numbers. It
// returns the sequence reached and false when the guest had no more RX
// buffers. The socket's peek offset is put back where new data continues
// (seqToGuest).
func (t *Table) resend(now time.Time, f *conn, w guestring.Sink, from, end uint32) (uint32, bool) {
	hdrLen, frameMax := t.frameShape(f)
	off := int(from - f.seqAckFromGuest)
	t.bufs = t.bufs[:0]
	if !f.peekOff && off > 0 {
		t.bufs = append(t.bufs, t.discardBuf()[:off])
	}
	nfr, _, blocked := t.reserveFrames(w, hdrLen, frameMax, int(end-from))
	if nfr == 0 {
		t.bufs = t.bufs[:0]
		if blocked {
			t.rxBlocked(f, true)
		}
		return from, !blocked
	}
	if !blocked {
		t.rxBlocked(f, false)
	}
	if f.peekOff {
		if err := t.setPeekOff(f.fd, off); err != nil {
			w.Abort()
			t.bufs = t.bufs[:0]
			t.log.Debug("tcp SO_PEEK_OFF for a resend failed", "err", err)
			f.sackRecovery = false // the ACK timeout recovers
			return from, true
		}
	}
	t.reads++
	r, err := t.io.Peek(f.fd, t.bufs)
	f.stopRTT()
	if f.peekOff {
		if err := t.setPeekOff(f.fd, int(f.inFlight())); err != nil {
			// New data would be read from the hole's offset and sent
			// at seqToGuest: other bytes at their sequence. Nothing
			// is committed yet.
			w.Abort()
			t.bufs = t.bufs[:0]
			t.log.Debug("tcp SO_PEEK_OFF restore failed: connection reset", "err", err)
			t.resetFlow(f, now, stats.TCPError)
			return from, true
		}
	}
	got := 0
	switch err {
	case nil:
		got = r
		if !f.peekOff {
			got -= off
		}
		got = max(got, 0)
	case unix.EAGAIN:
	default:
		w.Abort()
		t.bufs = t.bufs[:0]
		t.log.Debug("tcp read from host failed", "err", err)
		t.resetFlow(f, now, resetReason(err))
		return from, true
	}
	seq, rest, committed := from, got, 0
	for i := 0; i < nfr && rest > 0; i++ {
		fr := &t.frm[i]
		n := min(fr.capLen, rest)
		t.commitFrame(f, w, fr, seq, n, rest == n)
		seq += uint32(n)
		rest -= n
		committed++
	}
	if committed < nfr {
		w.Abort()
	}
	t.bufs = t.bufs[:0]
	t.stats.BytesToGuest.Add(uint64(got))
	if blocked {
		t.rxBlocked(f, true)
	}
	return seq, !blocked
}

// Tail-loss probe (after RFC 8985 §7): when the end of a flight is lost
// and nothing more can be sent, no ACK comes to show it. Two round trips
// after the last ACK progress, the last segment in flight goes again:
// lost with the rest, the guest SACKs it (a recovery starts at once: it
// has all after the hole), or it ACKs everything it got.
const (
	tlpDue  = 1 // a probe is due in the next output pass
	tlpSent = 2 // a probe went since the last ACK progress
)

// minPTO is the floor of the probe timeout: a guest's ACK for a lone
// segment may be delayed, and a probe too early is a segment for nothing.
const minPTO = 10 * time.Millisecond

// tlpArmed reports whether f is to be probed: SACK, data in flight and
// nothing more sent, no recovery or rewind under way, no probe since the
// last ACK progress, a round trip measured.
func (t *Table) tlpArmed(f *conn) bool {
	return f.tlp == 0 && f.sendsNothing() && f.inFlight() > 0 && !f.sackRecovery &&
		f.seqToGuest == f.sndMax && f.srtt != 0 && f.fd >= 0 && t.sackOK(f)
}

// delAckAllowance is RFC 8985's WCDelAckT: how long a receiver may delay
// its ACK for a lone segment (a Linux guest delays it 40 ms or more).
const delAckAllowance = 200 * time.Millisecond

// pto is the probe timeout: two round trips, within [minPTO, rto/2]; with
// one segment in flight, plus the delayed-ACK allowance, within the RTO
// (RFC 8985 7.2), or a lone server push would be probed before the guest's
// delayed ACK could come.
func (t *Table) pto(f *conn) time.Duration {
	p := max(2*f.srtt, minPTO)
	if int(f.inFlight()) <= f.mssToGuest {
		return min(p+delAckAllowance, t.rto(f))
	}
	return min(p, t.rto(f)/2)
}

// sendTailProbe sends the last segment in flight again. It returns false
// when the guest had no RX buffer (the probe stays due).
func (t *Table) sendTailProbe(now time.Time, f *conn, w guestring.Sink) bool {
	end := f.seqToGuest
	if f.has(evSockFin) && seqGT(end, f.eofSeq) {
		end = f.eofSeq // the FIN is not a byte in the socket
	}
	from := end - uint32(f.mssToGuest)
	if seqLT(from, f.seqAckFromGuest) {
		from = f.seqAckFromGuest
	}
	if seqLT(from, end) && f.fd >= 0 {
		// Only a FIN in flight: the ACK timeout sends it again (rewind).
		reached, ok := t.resend(now, f, w, from, end)
		if !ok && reached == from {
			return false
		}
		if f.flags&flRstDue != 0 {
			return true // the resend failed and reset the connection
		}
		t.stats.Retransmits[stats.TCPRetransTailProbe].Add(1)
	}
	f.tlp = tlpSent
	return true
}

package tcp

import (
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
)

// The guest's segments (the TX path's side of a connection): parsed from the
// frame's Packet, matched to a connection or opening one, their ACK and
// window taken, their payload written to the host socket straight from
// guest memory.

// segment is a guest TCP segment with its headers parsed out of the
// copied head, and where its payload is in guest memory.
type segment struct {
	key        connKey
	srcMAC     [6]byte
	src, dst   netip.Addr
	srcPort    uint16
	dstPort    uint16
	seq, ack   uint32
	flags      header.TCPFlags
	wnd        uint16
	opts       header.TCPOptions // parsed on a SYN only
	rawOpts    []byte            // the option bytes (in the copied head): an ACK's SACK blocks are read from them when needed
	payloadOff int               // from the start of the Ethernet frame
	payloadLen int
}

// segmentFrom fills sg from p, a parsed guest frame. It reports false for
// anything that is not a well-formed TCP segment: no TCP header, or one
// that header.ParseFrame found truncated or malformed, or a fragment.
func segmentFrom(p *header.Packet, sg *segment) bool {
	th := p.TCP
	if th == nil {
		return false
	}
	sg.srcMAC = p.SourceMAC()
	sg.src, sg.dst = p.Src, p.Dst
	sg.srcPort = th.SourcePort()
	sg.dstPort = th.DestinationPort()
	sg.seq = th.SequenceNumber()
	sg.ack = th.AckNumber()
	sg.flags = th.Flags()
	sg.wnd = th.WindowSize()
	sg.opts = header.TCPOptions{}
	sg.rawOpts = th.Options()
	if sg.flags.Has(header.TCPFlagSYN) {
		// A bad option list leaves what decoded before it; the SYN is still
		// answered with defaults, as a host stack would.
		_ = header.ParseTCPOptions(th.Options(), &sg.opts)
	}
	sg.payloadOff = p.L4Off + len(th)
	sg.payloadLen = p.L4Len - len(th)
	sg.key = connKey{
		guestAddr:  sg.src.As16(),
		remoteAddr: sg.dst.As16(),
		guestPort:  sg.srcPort,
		remotePort: sg.dstPort,
		v6:         sg.src.Is6(),
	}
	return true
}

// HandleGuestFrame translates one guest frame carrying TCP. p is the
// frame's parse (header.ParseFrame, of a copy of its first bytes); the
// frame itself is p.Len bytes at byte offset skip of the iovecs frame
// (guest memory: the TX chain's readable buffers, skip = virtio-net header
// length). Headers are only ever read from p; payload is written to the
// host socket straight from frame. It reports false for a frame that is
// not a well-formed TCP segment (the caller counts the drop).
func (t *Table) HandleGuestFrame(now time.Time, p *header.Packet, frame [][]byte, skip int) bool {
	sg := &t.seg
	if !segmentFrom(p, sg) {
		return false
	}
	s, ok := t.byKey[sg.key]
	if !ok {
		t.FlushSends(now) // a slot the run's connection left may be taken
		// Another queue pair may hold it: the guest moved the socket to
		// another TX queue (directory.go). Neither an RST nor a second
		// connection then.
		if t.fetchElsewhere(&sg.key) {
			return true
		}
		// Connections exist only where the address policy let them; a
		// segment without one is judged before it opens one or gets an RST.
		v := t.policy.Outbound(now, addrpolicy.TCP, sg.src, netip.AddrPortFrom(sg.dst, sg.dstPort))
		syn := sg.flags&(header.TCPFlagSYN|header.TCPFlagACK|header.TCPFlagRST|header.TCPFlagFIN) == header.TCPFlagSYN
		if !v.Allowed() {
			if syn {
				t.stats.ConnectFailures[stats.TCPPolicy].Add(1)
			}
			return true
		}
		t.learnGuest(sg)
		if syn {
			t.connect(now, sg, v)
		} else {
			t.queueRST(sg)
		}
		return true
	}
	t.learnGuest(sg)
	f := &t.flows[s]
	t.flushBefore(now, f, sg)
	t.guestSegment(now, f, sg, frame, skip)
	if f.state != stats.TCPFree {
		t.noteDeadline(f)
	}
	return true
}

// guestSegment handles a segment for an existing connection.
func (t *Table) guestSegment(now time.Time, f *conn, sg *segment, frame [][]byte, skip int) {
	if f.state != stats.TCPResetting {
		// A resetting flow's deadline runs from the reset: a guest that
		// keeps sending but never refills RX must not keep its slot.
		f.lastActivity = now
	}
	if sg.flags.Has(header.TCPFlagRST) {
		if t.guestRSTAcceptable(now, f, sg) {
			t.stats.RSTReceived.Add(1)
			if f.state != stats.TCPResetting {
				t.stats.Resets[stats.TCPGuestRST].Add(1)
			}
			t.dropFlow(f, true)
		}
		return
	}
	syn := sg.flags.Has(header.TCPFlagSYN)
	switch f.state {
	case stats.TCPResetting:
		return
	case stats.TCPSynSent:
		t.guestSynAck(now, f, sg)
		return
	case stats.TCPConnecting:
		// A retransmitted SYN while connect() is pending: the SYN-ACK goes
		// when the host connection is up; never reset here (invariant 8).
		return
	case stats.TCPSynAckSent:
		if syn && !sg.flags.Has(header.TCPFlagACK) {
			if sg.seq == f.seqInitFromGuest {
				f.flags |= flSynAckDue // our SYN-ACK may have been lost
				t.markDirty(f)
			}
			return
		}
		if !sg.flags.Has(header.TCPFlagACK) {
			return
		}
		// The SYN-ACK went out once (seqToGuest moved past iss): an ACK of
		// it is good even if a retransmitted SYN, in the same batch, asked
		// for it again; that repeat is then moot.
		if sg.ack != f.iss+1 || f.seqToGuest != f.iss+1 {
			t.resetFlow(f, now, stats.TCPError)
			return
		}
		f.flags &^= flSynAckDue
		t.establish(now, f)
		if f.state != stats.TCPEstablished {
			return
		}
	}
	if syn || !sg.flags.Has(header.TCPFlagACK) {
		// A SYN on an established connection, or a segment without ACK:
		// answer with an ACK that tells the guest where we are (RFC 9293
		// 3.10.7.4, RFC 5961 §4) and drop it.
		t.challengeAck(now, f)
		return
	}
	if !t.guestAck(now, f, sg) {
		return
	}
	t.guestData(now, f, sg, frame, skip)
}

// guestRSTAcceptable checks a guest RST against the connection (RFC 5961
// §3.2, RFC 9293 3.10.7), so that a guest segment carrying a stale or
// guessed sequence number cannot reset it: to our SYN (a forwarded
// connection) an RST counts only if it acknowledges the SYN; otherwise only
// at exactly the next byte we expect. One elsewhere in the window we
// advertised gets a challenge ACK (telling a guest that really means it
// where to reset), one outside it is dropped.
func (t *Table) guestRSTAcceptable(now time.Time, f *conn, sg *segment) bool {
	switch f.state {
	case stats.TCPSynSent:
		return sg.flags.Has(header.TCPFlagACK) && sg.ack == f.iss+1
	case stats.TCPResetting:
		return true // our RST is on its way; the guest's ends it sooner
	}
	next := f.seqFromGuest
	if sg.seq == next {
		return true
	}
	if seqGT(sg.seq, next) && seqLT(sg.seq, next+max(f.wndSent, 1)) {
		t.challengeAck(now, f)
	}
	return false
}

// guestAck processes the ACK number and window of sg. It reports false when
// the segment must be dropped.
func (t *Table) guestAck(now time.Time, f *conn, sg *segment) bool {
	ack := sg.ack
	if seqGT(ack, f.sndMax) {
		// ACKs data we never sent (RFC 5961 §5.2).
		t.challengeAck(now, f)
		return false
	}
	wnd := min(uint32(sg.wnd)<<f.wsFromGuest, maxWindow)
	// SACK blocks say what of the flight the guest has (sack_recovery.go).
	// Blocks take at least 10 option bytes. They are read only where they
	// are used: a repeated ACK, or any ACK during a recovery. An ACK that
	// moves on outside one needs none, and a Linux guest's timestamps make
	// every ACK 10 option bytes or more: no option parse per ACK.
	sack := t.sackOK(f) && len(sg.rawOpts) >= 10 && f.inFlight() > 0 &&
		(ack == f.seqAckFromGuest || f.sackRecovery) && t.readGuestSACK(f, sg)
	progressed := false
	if seqGT(ack, f.seqAckFromGuest) {
		dataEnd := ack
		if f.has(evSockFin) && seqGT(ack, f.eofSeq) {
			dataEnd = f.eofSeq // our FIN is not a byte in the socket
			f.events |= evGuestFinSent | evGuestFinAck
		}
		n := dataEnd - f.seqAckFromGuest
		if n > 0 && f.fd >= 0 {
			t.queueConsume(f, n) // at the batch's end (consume.go)
		}
		f.seqAckFromGuest = ack
		// The recovery point and the highest SACKed sequence mean
		// something only ahead of the ACK: left behind, they would read
		// as ahead of it again 2 GiB later (sequence numbers wrap), or at
		// once for a flight that crosses 0, and turn duplicate ACKs that
		// report a loss into echoes to ignore.
		if seqGT(ack, f.recover) {
			f.recover = ack - 1
		}
		if seqGT(ack, f.sackHigh) {
			f.sackHigh = ack
		}
		if seqGT(ack, f.seqToGuest) {
			// An ACK for data sent before a rewind: skip what it covers.
			// SO_PEEK_OFF moved back with the discard and stops at 0,
			// which is exactly ack now.
			f.seqToGuest = ack
		}
		f.ackRTT(now, ack)
		f.tlp = 0
		f.retrans = 0
		f.dupAcks = 0
		f.lastAckProg = now
		progressed = true
		t.sackAckProgress(f, sack)
	} else if ack == f.seqAckFromGuest && sg.payloadLen == 0 && !sg.flags.Has(header.TCPFlagFIN) && f.inFlight() > 0 {
		switch {
		case wnd != 0 && f.flags&flZeroWnd != 0:
			// The guest shut its window on data in flight and opens it
			// again without acknowledging any: what we sent into the zero
			// window it dropped. Send it again now, not at the ACK
			// timeout.
			t.rewind(now, f, stats.TCPRetransWindow)
		case t.sackOK(f):
			// Only SACK blocks say whether this repeat reports a loss:
			// the guest's window grows with out-of-order data, and a
			// duplicate frame is echoed with a D-SACK.
			if sack {
				t.sackDupAck(f)
			}
		case wnd == f.wndFromGuest:
			// The guest is asking for the data after ack again: once per
			// loss. A duplicate that does not pass the recovery point
			// (the highest sequence sent at the last rewind) is the echo
			// of data sent before that rewind, which the rewind already
			// sends again (NewReno's rule, RFC 6582 §3.2).
			f.dupAcks++
			if f.dupAcks == 2 && seqGT(ack, f.recover) {
				t.rewind(now, f, stats.TCPRetransDupAck)
			}
		}
	}
	// A zero window while data is in flight is ignored, as passt does: some
	// guest kernels send one transiently when short of memory ("net: tcp:
	// send zero-window ACK when no memory"), and taking it would stall us.
	// It is remembered: if the guest reopens without an ACK, it dropped
	// what was sent meanwhile (above).
	opened := false
	if wnd != 0 || f.inFlight() == 0 {
		opened = wnd > f.wndFromGuest
		f.wndFromGuest = wnd
		f.flags &^= flZeroWnd
		if opened && f.inFlight() == 0 {
			f.retrans = 0 // zero-window probes are over
		}
	} else {
		f.flags |= flZeroWnd
	}
	if progressed || opened {
		if f.flags&flStalled != 0 {
			t.unstall(f)
		}
		t.markDirty(f)
	}
	return true
}

// toSocket writes n bytes of bufs, from offset off, to f's socket: what
// it took extends the data from the guest. ok is false when the write
// failed (f was reset).
func (t *Table) toSocket(now time.Time, f *conn, bufs [][]byte, off, n int) (written int, ok bool) {
	w, err := t.io.Send(f.fd, bufs, off, n)
	switch err {
	case nil:
	case unix.EAGAIN, unix.ENOBUFS, unix.ENOMEM:
		// Full, or the kernel short of memory for now: nothing was
		// written.
		w = 0
	default:
		t.log.Debug("tcp write to host failed", "err", err)
		t.resetFlow(f, now, resetReason(err))
		return 0, false
	}
	f.seqFromGuest += uint32(w)
	t.stats.BytesFromGuest.Add(uint64(w))
	if w > 0 {
		t.noteSender(now, f)
	}
	if w < n {
		// The socket is full: the guest retransmits the rest (or, kept
		// out of order, it goes at EPOLLOUT); we tell the guest when
		// space frees up (EPOLLOUT → window update). The refused write
		// set SOCK_NOSPACE, so the kernel wakes us without a poll.
		f.flags |= flWantOut | flOutArmed
		t.updateEpoll(f)
	}
	return w, true
}

// dupAcksToSend is how many duplicate ACKs announce a gap (Linux's default
// reordering threshold).
const dupAcksToSend = 3

// dupAcksFor announces a gap at f's next expected byte: our ACK goes
// again, three times over once per gap, so the guest's fast retransmit
// resends from there instead of waiting for its retransmission timeout.
func (t *Table) dupAcksFor(f *conn) {
	f.flags |= flAckDue
	if !f.dupAckSent || f.dupAckSeq != f.seqFromGuest {
		f.dupAckSent, f.dupAckSeq, f.dupAcksDue = true, f.seqFromGuest, dupAcksToSend
	}
	// They must name the byte the guest is to send again: where ACKs
	// follow the host peer's (tcpi_bytes_acked) they may lag what was
	// written, and a lagging ACK is not a duplicate to the guest. No
	// refresh has seen the data it covers: the right edge stays.
	f.ackAllKeepingEdge()
	t.markDirty(f)
}

// fillsHole reports whether in-order data now fills a hole: data is kept
// past it, or our duplicate ACKs named this sequence.
func (f *conn) fillsHole() bool {
	return f.ooo != nil || (f.dupAckSent && f.dupAckSeq == f.seqFromGuest)
}

// guestData writes sg's payload to the host socket and handles its FIN.
func (t *Table) guestData(now time.Time, f *conn, sg *segment, frame [][]byte, skip int) {
	l := sg.payloadLen
	fin := sg.flags.Has(header.TCPFlagFIN)
	if l == 0 && !fin {
		if seqLT(sg.seq, f.seqFromGuest) {
			f.flags |= flAckDue // keep-alive probe
			t.markDirty(f)
		}
		return
	}
	if f.has(evGuestFin) {
		if fin || l > 0 {
			f.flags |= flAckDue // retransmitted FIN: our ACK was lost
			t.markDirty(f)
		}
		return
	}
	if l > 0 && !fin && t.gatherData(f, sg, frame, skip) {
		return // written with the rest of its run (send_gather.go)
	}
	if t.gathering(f) {
		t.FlushSends(now)
		if f.fd < 0 {
			return
		}
	}
	off := int32(f.seqFromGuest - sg.seq)
	if off < 0 {
		// A gap: something before this segment is missing (lost on the
		// way, or a write to the host socket came up short). With SACK we
		// keep it and say so (outoforder.go); otherwise, or when it does
		// not fit, it is dropped. Either way our ACK goes again, three
		// times over once per gap, so the guest's fast retransmit resends
		// from there instead of waiting for its retransmission timeout.
		t.keepOutOfOrder(f, sg, frame, skip)
		t.dupAcksFor(f)
		return
	}
	if l > 0 {
		if int(off) >= l {
			f.flags |= flAckDue // all old: the guest missed our ACK
			t.markDirty(f)
		} else if f.fd >= 0 {
			filled := f.fillsHole()
			n, ok := t.toSocket(now, f, frame, skip+sg.payloadOff+int(off), l-int(off))
			if !ok {
				return
			}
			whole := n == l-int(off)
			if whole && f.ooo != nil {
				// The hole may be filled: what was kept after it follows.
				t.writeOutOfOrder(now, f)
				if f.fd < 0 {
					return
				}
			} else if f.ooo != nil {
				// Written in part, perhaps into what was kept: that part
				// is forgotten, so the rest of it is next (oooReady) and
				// goes at EPOLLOUT. Kept data starting before the next byte
				// was never written again.
				f.ooo.trim(f.seqFromGuest)
			}
			t.ackGuestData(now, f, whole, filled)
		}
	}
	if fin && sg.seq+uint32(l) == f.seqFromGuest {
		t.guestFin(now, f)
	}
}

// guestFin takes the guest's FIN, which follows everything written: the
// host socket is half-closed, and the FIN's ACK scheduled.
func (t *Table) guestFin(now time.Time, f *conn) {
	f.seqFromGuest++
	f.events |= evGuestFin
	if f.fd >= 0 {
		_ = unix.Shutdown(f.fd, unix.SHUT_WR)
		f.events |= evSockShut
	}
	t.setState(f, stats.TCPClosing)
	t.ackGuestFin(now, f)
}

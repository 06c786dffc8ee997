package tcp

import (
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
)

// Host data to the guest: peeked from the socket straight into reserved
// guest buffers, committed frame by frame.

// sendData peeks socket data into guest buffers, frame by frame, and
// commits what it read. seqToGuest advances only on Commit (invariant 1).
// It returns false when the guest ran out of RX buffers with data left.
func (t *Table) sendData(now time.Time, f *conn, w guestring.Sink) bool {
	if f.fd < 0 || f.has(evGuestFinSent) || (f.has(evSockFin) && f.seqToGuest == f.eofSeq) {
		return true
	}
	hdrLen, frameMax := t.frameShape(f)
	if f.drained {
		// Nothing came since the socket was emptied (no EPOLLIN since):
		// a read would only fail with EAGAIN. Nothing is sent, so nothing
		// waits for RX buffers either: a wait left by a resend that found
		// none (sack_recovery.go) ends here, or its EPOLLIN mask would
		// keep the socket from ever reporting new data.
		t.rxBlocked(f, false)
		return true
	}
	for retries := 0; ; {
		already := f.inFlight()
		wnd := min(f.wndFromGuest, maxWindow)
		if already >= wnd {
			t.stall(f, true)
			return true
		}
		t.bufs = t.bufs[:0]
		if !f.peekOff && already > 0 {
			t.bufs = append(t.bufs, t.discardBuf()[:already])
		}
		nfr, reserved, blocked := t.reserveFrames(w, hdrLen, frameMax, int(wnd-already))
		if nfr > 0 && !blocked {
			t.rxBlocked(f, false) // buffers came: whatever stops this pass, it is not them
		}
		if nfr == 0 {
			t.bufs = t.bufs[:0]
			if blocked {
				t.rxBlocked(f, true)
				return false
			}
			return true
		}
		t.reads++
		r, err := t.io.Peek(f.fd, t.bufs)
		got := 0
		eof := false
		switch err {
		case nil:
			got = r
			if !f.peekOff {
				got -= int(already)
			}
			// r == 0 is EOF at the peek offset. Without SO_PEEK_OFF, a read
			// that brings nothing past the bytes in flight is EOF once the
			// peer's FIN was seen — unless the socket holds more than
			// those bytes: then an urgent mark (SO_OOBINLINE) stopped the
			// read at their end, and the data behind it comes once they
			// are acknowledged (the FIN would overtake it). A short read
			// that brought data is not EOF either: the next pass finds
			// out, and the FIN waits for every byte.
			eof = r == 0 || (f.has(evSockRdHup) && got <= 0 &&
				(f.peekOff || hostsock.Readable(f.fd) <= int(already)))
			got = max(got, 0)
		case unix.EAGAIN:
			if !t.dataAtEAGAIN(f, already) {
				f.drained = true
				f.urgent = false
				break
			}
			// The kernel's EAGAIN at an urgent mark (dataAtEAGAIN): the
			// signal is handled on the way out, peek again. Should
			// signals keep coming, the socket is not taken for empty:
			// the guest's ACK or the ACK timeout reads again, and with
			// nothing in flight, an ACK check's look.
			if retries < 3 {
				retries++
				w.Abort()
				t.bufs = t.bufs[:0]
				continue
			}
			if already == 0 && f.ackDueAt.IsZero() {
				f.ackDueAt = now.Add(t.ackCheckInterval(f))
			}
		default:
			w.Abort()
			t.bufs = t.bufs[:0]
			t.log.Debug("tcp read from host failed", "err", err)
			t.resetFlow(f, now, resetReason(err))
			return true
		}
		startedIdle := already == 0
		first := f.seqToGuest
		fresh := first == f.sndMax // nothing of it was sent before (Karn: resent bytes are not timed)
		rest := got
		committed := 0
		for i := 0; i < nfr && rest > 0; i++ {
			fr := &t.frm[i]
			n := min(fr.capLen, rest)
			last := rest == n
			t.commitData(f, w, fr, n, last)
			rest -= n
			committed++
		}
		if committed < nfr {
			w.Abort()
		}
		t.bufs = t.bufs[:0]
		if got > 0 {
			t.stats.BytesToGuest.Add(uint64(got))
			if startedIdle {
				f.lastAckProg = now // the ACK timeout runs from the first unacked byte
			}
			if fresh {
				f.timeSend(now, first+1)
			}
			f.flags &^= flAckDue
		}
		if eof {
			f.events |= evSockFin
			f.eofSeq = f.seqToGuest
		}
		switch {
		case got == 0 && !eof && already > 0:
			// Everything readable is in flight. Buffers were there: a wait
			// for them is over, and new host data must wake us (EPOLLIN).
			t.rxBlocked(f, false)
			t.stall(f, false)
			return true
		case got < reserved && got > 0 && !eof && (f.urgent || f.has(evSockRdHup) || seqLT(f.seqToGuest, f.sndMax)):
			// Short, but something may be queued behind: a read stops
			// short at an urgent mark with data behind it, and the peer's
			// FIN may wait behind this data (EOF). If either had come
			// before the epoll_wait that brought us here, no new EPOLLIN
			// comes for it: peek again, in this pass. Below sndMax (a
			// resend after a rewind) the socket holds more for certain:
			// what was sent before is still there, and an urgent mark
			// that stopped this read is no longer news (f.urgent was
			// cleared when it was first read past).
			if t.clearStalled(f) {
				t.updateEpoll(f)
			}
			continue
		case got < reserved:
			// The socket had nothing more (EAGAIN, EOF, or a short read
			// with nothing behind it): done for now. A TCP read copies
			// every queued segment it has room for (tcp_recvmsg stops
			// early only at an urgent mark), so after a short read the
			// socket is empty and what comes next is a new edge
			// (EPOLLIN): a read now would only fail with EAGAIN, one
			// system call per pass that sends.
			if got > 0 && !eof {
				f.drained = true
			}
			t.rxBlocked(f, false)
			if got > 0 && t.clearStalled(f) {
				t.updateEpoll(f)
			}
			return true
		case blocked:
			t.rxBlocked(f, true)
			return false
		}
		// Every reserved byte was filled: there may be more, go on.
		if t.clearStalled(f) {
			t.updateEpoll(f)
		}
	}
}

// dataAtEAGAIN reports whether f's socket holds data to read although a
// peek with already bytes in flight failed with EAGAIN. A non-blocking
// read that starts at an urgent mark fails so whenever a signal is pending
// (tcp_recvmsg: "Stop if we have read anything or have SIGURG pending"),
// with data and the peer's FIN queued behind the mark, and Go's runtime
// signals its threads (SIGURG preemption) at any time. Taken for an empty
// socket, that EAGAIN left the connection drained with no edge to come:
// the data and the FIN never reached the guest (found under CPU load:
// "abcxhello" without our FIN, or only "abc"). The data is certainly
// there below sndMax (a resend) and, without SO_PEEK_OFF, with bytes in
// flight (the read starts at the head); otherwise a read can start at a
// mark only after EPOLLPRI (f.urgent), and SIOCINQ tells.
func (t *Table) dataAtEAGAIN(f *conn, already uint32) bool {
	switch {
	case seqLT(f.seqToGuest, f.sndMax), !f.peekOff && already > 0:
		return true
	case f.urgent:
		return hostsock.Readable(f.fd) > int(already)
	}
	return false
}

// frameShape returns the header length of f's frames to the guest and the
// most payload one frame carries: one MSS, or with TSO one GSO frame whose
// IP packet stays within 64 KiB.
func (t *Table) frameShape(f *conn) (hdrLen, frameMax int) {
	v6 := f.key.v6
	hdrLen = header.EthernetMinimumSize + t.ipHdrLen(v6) + header.TCPMinimumSize
	frameMax = f.mssToGuest
	if (v6 && t.tso6) || (!v6 && t.tso4) {
		frameMax = (0xffff - t.ipHdrLen(v6) - header.TCPMinimumSize) / f.mssToGuest * f.mssToGuest
		if v6 {
			frameMax = (0xffff - header.TCPMinimumSize) / f.mssToGuest * f.mssToGuest
		}
	}
	return hdrLen, frameMax
}

// reserveFrames reserves guest RX buffers for up to fill payload bytes,
// frameMax per frame, into t.frm, their payload iovecs appended to t.bufs
// (after whatever the caller put there to skip). blocked reports that the
// guest ran out of buffers before fill was reached.
func (t *Table) reserveFrames(w guestring.Sink, hdrLen, frameMax, fill int) (nfr, reserved int, blocked bool) {
	for fill > 0 && nfr < len(t.frm) && len(t.bufs) < hostsock.MaxIovecs {
		hdr, pay, st := w.Reserve(hdrLen, min(fill, frameMax))
		if st != guestring.OK {
			return nfr, reserved, true
		}
		fr := &t.frm[nfr]
		fr.hdr, fr.first, fr.capLen = hdr, len(t.bufs), 0
		for _, b := range pay {
			if len(t.bufs) == hostsock.MaxIovecs {
				// One recvmsg takes no more iovecs: the frame carries
				// less than reserved, and reserved counts only what the
				// peek can fill, so a short read is never mistaken for
				// the end of the data.
				break
			}
			if len(b) > fill-fr.capLen {
				b = b[:fill-fr.capLen]
			}
			if len(b) == 0 {
				continue
			}
			t.bufs = append(t.bufs, b)
			fr.capLen += len(b)
		}
		fr.nbufs = len(t.bufs) - fr.first
		nfr++
		if fr.capLen == 0 {
			break
		}
		reserved += fr.capLen
		fill -= fr.capLen
	}
	return nfr, reserved, false
}

// stall marks f STALLED (invariant 4): wnd when the guest's window is the
// limit, otherwise all readable data is in flight.
func (t *Table) stall(f *conn, wnd bool) {
	was := f.flags & (flStalled | flWndStall)
	f.flags |= flStalled
	if wnd {
		f.flags |= flWndStall
	} else {
		f.flags &^= flWndStall
	}
	if was&flStalled == 0 {
		t.stats.Stalls.Add(1)
		t.stats.Stalled.Add(1)
	}
	if was != f.flags&(flStalled|flWndStall) {
		t.updateEpoll(f)
	}
}

// clearStalled takes f out of STALLED; it reports whether f was.
func (t *Table) clearStalled(f *conn) bool {
	was := f.flags&flStalled != 0
	f.flags &^= flStalled | flWndStall
	if was {
		t.stats.Stalled.Add(-1)
	}
	return was
}

// rxBlocked records whether f waits for guest RX buffers. While it does,
// EPOLLIN is masked: the data would not fit anywhere, and level-triggered
// readiness would spin the loop. The pending output pass retries it.
func (t *Table) rxBlocked(f *conn, b bool) {
	if b == (f.flags&flRxBlocked != 0) {
		return
	}
	if b {
		f.flags |= flRxBlocked
	} else {
		f.flags &^= flRxBlocked
	}
	t.updateEpoll(f)
}

// commitData fills the headers of reserved frame fr for n payload bytes at
// seqToGuest, commits it and advances seqToGuest past it.
func (t *Table) commitData(f *conn, w guestring.Sink, fr *reservedFrame, n int, last bool) {
	t.commitFrame(f, w, fr, f.seqToGuest, n, last)
	f.seqToGuest += uint32(n)
	f.sndMax = seqMax(f.sndMax, f.seqToGuest)
}

// commitFrame fills the headers of reserved frame fr for n payload bytes
// at sequence seq and commits it.
func (t *Table) commitFrame(f *conn, w guestring.Sink, fr *reservedFrame, seq uint32, n int, last bool) {
	fl := header.TCPFlagACK
	if last {
		fl |= header.TCPFlagPSH
	}
	payload := t.bufs[fr.first : fr.first+fr.nbufs]
	t.buildHeaders(f, fr.hdr, fl, seq, nil, payload, n)
	w.Commit(n, &t.vh)
}

package tcp

import (
	"encoding/binary"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// sndBufRefresh is how often a connection's SO_SNDBUF is re-read.
const sndBufRefresh = 100 * time.Millisecond

// Flush runs the output pass: every connection with something due (data
// from its socket, SYN-ACK, ACK, window update, FIN, RST) writes it through
// w, in that order per connection (DESIGN invariant 2: one ordered output,
// so a flag never overtakes data). The loop calls it once per iteration
// after handling TX frames, socket events and timers, and again when the
// guest posts RX buffers. blocked reports that the guest's RX ring ran out:
// the unserved connections stay queued, and the loop must call Flush again
// when buffers arrive (enable RX kicks); no timer is involved.
func (t *Table) Flush(now time.Time, w guestring.Sink) (blocked bool) {
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
			t.markDirty(f)
			return true
		}
		if f.state != stats.TCPFree {
			t.noteTimer(t.deadline(f))
		}
	}
	return false
}

// output writes everything due for f. It returns false when the guest had
// no RX buffer for something that was due.
func (t *Table) output(now time.Time, f *conn, w guestring.Sink) bool {
	if f.flags&flRstDue != 0 {
		if !t.sendFlags(f, w, header.TCPFlagRST|header.TCPFlagACK, f.seqToGuest) {
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
		return true
	}
	t.refreshAckWnd(now, f)
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
	check := f.flags&flAckCheck != 0
	f.flags &^= flAckCheck
	if f.flags&flAckDue != 0 || f.seqAckToGuest != f.ackSent || t.windowUpdateDue(f) {
		if !t.sendFlags(f, w, header.TCPFlagACK, f.seqToGuest) {
			return false
		}
		f.ackCheckIvl = 0
	} else if check && !f.ackDueAt.IsZero() {
		// The check found nothing new: look again, less and less often.
		f.ackCheckIvl = min(2*max(f.ackCheckIvl, t.cfg.AckInterval), max(ackCheckMax, t.cfg.AckInterval))
		f.ackDueAt = now.Add(f.ackCheckIvl)
	}
	for ; f.dupAcksDue > 0; f.dupAcksDue-- {
		if !t.sendFlags(f, w, header.TCPFlagACK, f.seqToGuest) {
			return false
		}
	}
	if f.has(evGuestFin | evGuestFinSent | evGuestFinAck) {
		// Both directions are closed and acknowledged: done.
		t.dropFlow(f, false)
	}
	return true
}

// windowUpdateDue reports whether the window we advertise grew enough since
// the last frame to be worth a frame of its own. Shrinking is never
// announced: the guest finds out with the next frame.
func (t *Table) windowUpdateDue(f *conn) bool {
	if f.wndToGuest <= f.wndSent || f.wndToGuest>>f.wsToGuest == f.wndSent>>f.wsToGuest {
		return false
	}
	return f.wndSent < uint32(2*f.mssToGuest) || f.wndToGuest-f.wndSent >= f.wndSent/2
}

// refreshAckWnd updates the ACK number and window we give the guest from
// the host socket (DESIGN invariants 5 and 7).
func (t *Table) refreshAckWnd(now time.Time, f *conn) {
	if f.fd < 0 {
		f.seqAckToGuest = f.seqFromGuest
		return
	}
	haveInfo := hostsock.TCPInfo(f.fd, &t.info)
	local := f.flags&flLocal != 0 && !t.cfg.AckOnPeerAck
	peerAcks := false
	switch {
	case !haveInfo || t.cfg.AckOnWrite || local || f.has(evGuestFin):
		// Written to the socket is good enough: the local peer's kernel
		// has it (or the guest closed and must not wait for the peer).
		f.seqAckToGuest = f.seqFromGuest
	default:
		// Remote peer: ACK what it acknowledged, so the guest feels the
		// end-to-end backpressure.
		peerAcks = true
		a := f.ackBase + uint32(t.info.Bytes_acked)
		if seqGT(a, f.seqFromGuest) {
			a = f.seqFromGuest
		}
		if seqGT(a, f.seqAckToGuest) {
			f.seqAckToGuest = a
		}
		if f.seqAckToGuest != f.seqFromGuest && f.ackDueAt.IsZero() {
			f.ackDueAt = now.Add(t.ackCheckInterval(f))
		}
	}
	handshake := f.state == stats.TCPSynAckSent || f.state == stats.TCPSynSent
	peerWnd := uint32(maxWindow)
	queued := 0
	if haveInfo {
		peerWnd = t.info.Snd_wnd
		if handshake && peerWnd == 0 {
			peerWnd = 65535
		}
		// Bytes in our send queue, unsent or unacknowledged (SIOCOUTQ,
		// without the system call): written minus acknowledged.
		queued = max(int(int32(f.seqFromGuest-f.ackBase-uint32(t.info.Bytes_acked))), 0)
	} else {
		queued = hostsock.SendQueued(f.fd)
	}
	sndMSS := 0
	if haveInfo {
		sndMSS = int(t.info.Snd_mss)
	}
	space, full := t.sendSpace(now, f, queued, sndMSS)
	wnd := min(uint32(space), uint32(0xffff)<<f.wsToGuest, maxWindow)
	if handshake || peerAcks {
		// Mirror the peer's window where ACKs follow the peer (and in the
		// handshake, before anything was written). Where ACKs follow our
		// writes the send buffer alone decides: the kernel queues what the
		// peer cannot take yet, and a window held down by tcpi_snd_wnd
		// would have no wake-up when the peer reopens it.
		wnd = min(wnd, peerWnd)
	}
	f.wndToGuest = wnd
	if handshake {
		return
	}
	// A window that is not worth the guest's while needs a trigger to
	// reopen it. When the send buffer is full by the kernel's own measure,
	// that trigger is EPOLLOUT: polling the socket now (epoll_ctl) sets
	// SOCK_NOSPACE, and the ACK that frees a third of the buffer wakes
	// us (DESIGN invariant 7: window updates go out as soon as space
	// opens, through the ordered output). The kernel signals nothing for
	// a socket that never looked full to it, hence the exact test.
	if full {
		if f.flags&flOutArmed == 0 {
			t.armOut(f)
		}
	} else if f.flags&flWantOut != 0 {
		f.flags &^= flWantOut | flOutArmed
		t.updateEpoll(f)
	}
	// Otherwise the window is at least a third of the buffer (see
	// sendSpace's cap), which the guest can fill, unless something else
	// held it down (the peer's window): look again shortly.
	if !full && wnd < f.guestMSS() && f.ackDueAt.IsZero() {
		f.ackDueAt = now.Add(t.ackCheckInterval(f))
	}
}

// ackCheckMax caps the backed-off delay between delayed-ACK checks that
// find nothing new to tell the guest.
const ackCheckMax = 200 * time.Millisecond

// ackCheckInterval is how soon f's next delayed-ACK check runs.
func (t *Table) ackCheckInterval(f *conn) time.Duration {
	if f.ackCheckIvl > 0 {
		return f.ackCheckIvl
	}
	return t.cfg.AckInterval
}

// sndRatioOne is 1.0 in conn.sndRatio's fixed point.
const sndRatioOne = 1024

// skbOverhead bounds the memory the kernel charges per skb of the send
// queue on top of its payload (sk_buff, shared info, header room: 832
// bytes on Linux 6.x x86-64).
const skbOverhead = 1024

// sndRatioMinQueued is how much send-buffer memory must be in use for
// its payload share to be measured (below it, one skb's overhead would
// dominate the estimate).
const sndRatioMinQueued = 8192

// sendSpace returns how many payload bytes f's host socket accepts now
// without a short write: the window the guest may fill. full reports that
// the kernel considers the socket not writable (tcp_poll: free space below
// half the memory queued), so that a poll now arms its EPOLLOUT wake-up.
//
// The kernel accounts the send buffer in memory (skb truesize), payload
// plus per-skb overhead: a buffer of sk_sndbuf bytes holds anywhere from
// half (small segments) to nearly all (64 KiB segments on loopback) of it
// in payload. So the free memory (SO_MEMINFO) is turned into payload with
// the ratio the queue itself shows (queued payload / queued memory), half
// until it has been measured. The queue's ratio can be better than what
// comes next (data coalesced into large skbs while the peer's window held
// it, then MSS-sized writes that go out one skb each), so it is capped by
// the ratio of one skb per guest segment (sndMSS, the socket's tcpi_snd_mss,
// bounds how much one skb carries). The kernel accepts a write while any
// memory is free, so the estimate errs on the safe side (DESIGN invariant
// 5): the guest never has more in flight than the socket takes.
func (t *Table) sendSpace(now time.Time, f *conn, queued, sndMSS int) (space int, full bool) {
	sndbuf, wq, ok := hostsock.SendMemory(f.fd)
	if !ok {
		// No SO_MEMINFO (before Linux 4.6): half of SO_SNDBUF, re-read now
		// and then (it only changes with auto-tuning) and whenever it
		// looks like the limit.
		if f.sndBuf == 0 || now.Sub(f.sndBufAt) >= sndBufRefresh || f.sndBuf/2-queued < f.mssToGuest {
			if sb, err := hostsock.GetInt(f.fd, unix.SOL_SOCKET, unix.SO_SNDBUF); err == nil {
				f.sndBuf, f.sndBufAt = sb, now
			}
		}
		if f.sndBuf <= 0 {
			return maxWindow, false
		}
		space = max(f.sndBuf/2-queued, 0)
		return space, space < f.mssToGuest
	}
	f.sndBuf, f.sndBufAt = sndbuf, now
	if queued > 0 && wq >= sndRatioMinQueued {
		f.sndRatio = uint16(min(max(queued*sndRatioOne/wq, sndRatioOne/4), sndRatioOne))
	}
	r := int(f.sndRatio)
	if r == 0 {
		r = sndRatioOne / 2
	}
	seg := f.mssToGuest
	if sndMSS > 0 {
		seg = min(seg, sndMSS)
	}
	r = min(r, seg*sndRatioOne/(seg+skbOverhead))
	// sk_stream_wspace < sk_stream_min_wspace, as tcp_poll computes it:
	// exactly, or a poll could report writable while we think not, and
	// EPOLLOUT would never stop.
	full = sndbuf-wq < wq>>1
	space = max(sndbuf-wq, 0) * r / sndRatioOne
	// The kernel wakes a full socket once a third of its buffer is free,
	// and a Linux guest sends nothing into a window smaller than its MSS,
	// which it bounds by half the largest window it was ever offered
	// (tcp_bound_to_half_wnd). Keeping every window at or below 5/8 of the
	// buffer keeps that MSS below the window the wake-up reopens; without
	// the cap the guest could sit on a third-of-the-buffer window, waiting
	// for more, with nothing left to announce it.
	if lim := sndbuf * r / sndRatioOne * 5 / 8; f.mssToGuest > lim/2 {
		space = min(space, lim)
	}
	return space, full
}

// armOut asks the kernel to tell f's loop, with EPOLLOUT, when its full
// send buffer has room again. Registering EPOLLOUT (or re-registering it:
// epoll_ctl polls the socket) sets SOCK_NOSPACE on a socket that is not
// writable; the wake-up that follows clears it, so every new full spell
// needs a poll of its own (flOutArmed tracks that).
func (t *Table) armOut(f *conn) {
	f.flags |= flWantOut | flOutArmed
	if f.inEpoll && f.epollEvents&unix.EPOLLOUT != 0 {
		f.epollEvents = 0 // same mask: force the epoll_ctl all the same
	}
	t.updateEpoll(f)
}

// guestMSS is the largest segment the guest sends into our window: its MSS,
// bounded (by Linux, tcp_bound_to_half_wnd) by half the largest window it
// has seen from us.
func (f *conn) guestMSS() uint32 {
	return max(min(uint32(f.mssToGuest), f.maxWndSent/2), 1)
}

// sendData peeks socket data into guest buffers, frame by frame, and
// commits what it read. seqToGuest advances only on Commit (invariant 1).
// It returns false when the guest ran out of RX buffers with data left.
func (t *Table) sendData(now time.Time, f *conn, w guestring.Sink) bool {
	if f.fd < 0 || f.has(evGuestFinSent) || (f.has(evSockFin) && f.seqToGuest == f.eofSeq) {
		return true
	}
	v6 := f.key.v6
	hdrLen := header.EthernetMinimumSize + t.ipHdrLen(v6) + header.TCPMinimumSize
	frameMax := f.mssToGuest
	if (v6 && t.tso6) || (!v6 && t.tso4) {
		// One GSO frame: the IP packet must stay within 64 KiB.
		frameMax = (0xffff - t.ipHdrLen(v6) - header.TCPMinimumSize) / f.mssToGuest * f.mssToGuest
		if v6 {
			frameMax = (0xffff - header.TCPMinimumSize) / f.mssToGuest * f.mssToGuest
		}
	}
	for {
		already := f.inFlight()
		wnd := min(f.wndFromGuest, maxWindow)
		if already >= wnd {
			t.stall(f, true)
			return true
		}
		fill := int(wnd - already)
		t.bufs = t.bufs[:0]
		if !t.peekOff && already > 0 {
			t.bufs = append(t.bufs, t.discard[:already])
		}
		nfr, reserved, blocked := 0, 0, false
		for fill > 0 && nfr < len(t.frm) && len(t.bufs) < hostsock.MaxIovecs {
			hdr, pay, st := w.Reserve(hdrLen, min(fill, frameMax))
			if st != guestring.OK {
				blocked = true
				break
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
		r, err := t.io.Peek(f.fd, t.bufs)
		got := 0
		eof := false
		switch err {
		case nil:
			got = r
			if !t.peekOff {
				got -= int(already)
			}
			// r == 0 is EOF at the peek offset. Without SO_PEEK_OFF, a read
			// that brings nothing past the bytes in flight is EOF once the
			// peer's FIN was seen. A short read that brought data is not:
			// the next pass finds out, and the FIN waits for every byte.
			eof = r == 0 || (f.has(evSockRdHup) && got <= 0)
			got = max(got, 0)
		case unix.EAGAIN:
		default:
			w.Abort()
			t.bufs = t.bufs[:0]
			t.log.Debug("tcp read from host failed", "err", err)
			t.resetFlow(f, now)
			return true
		}
		startedIdle := already == 0
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
		case got < reserved && got > 0 && !eof && f.has(evSockRdHup):
			// Short, but the peer's FIN is queued behind this data: peek
			// again, to reach it (EOF) in this pass.
			if f.flags&flStalled != 0 {
				f.flags &^= flStalled | flWndStall
				t.updateEpoll(f)
			}
			continue
		case got < reserved:
			// The socket had less than we had room for: done for now.
			t.rxBlocked(f, false)
			if f.flags&flStalled != 0 && got > 0 {
				f.flags &^= flStalled | flWndStall
				t.updateEpoll(f)
			}
			return true
		case blocked:
			t.rxBlocked(f, true)
			return false
		}
		// Every reserved byte was filled: there may be more, go on.
		if f.flags&flStalled != 0 {
			f.flags &^= flStalled | flWndStall
			t.updateEpoll(f)
		}
	}
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
	}
	if was != f.flags&(flStalled|flWndStall) {
		t.updateEpoll(f)
	}
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

// commitData fills the headers of reserved frame fr for n payload bytes and
// commits it.
func (t *Table) commitData(f *conn, w guestring.Sink, fr *reservedFrame, n int, last bool) {
	fl := header.TCPFlagACK
	if last {
		fl |= header.TCPFlagPSH
	}
	payload := t.bufs[fr.first : fr.first+fr.nbufs]
	t.buildHeaders(f, fr.hdr, fl, f.seqToGuest, nil, payload, n)
	w.Commit(n, &t.vh)
	f.seqToGuest += uint32(n)
	f.sndMax = seqMax(f.sndMax, f.seqToGuest)
}

// sendFlags sends a frame without payload. It returns false when the guest
// had no RX buffer.
func (t *Table) sendFlags(f *conn, w guestring.Sink, fl header.TCPFlags, seq uint32) bool {
	var opts []byte
	var ob [8]byte
	if fl.Has(header.TCPFlagSYN) {
		mss := min(t.cfg.MTU-t.ipHdrLen(f.key.v6)-header.TCPMinimumSize, 0xffff)
		o := header.TCPOptions{HasMSS: true, MSS: uint16(mss)}
		if f.wsToGuest > 0 {
			o.HasWindowScale, o.WindowScale = true, f.wsToGuest
		}
		opts = ob[:header.EncodeTCPOptions(ob[:], &o)]
	}
	hdrLen := header.EthernetMinimumSize + t.ipHdrLen(f.key.v6) + header.TCPMinimumSize + len(opts)
	hdr, _, st := w.Reserve(hdrLen, 0)
	if st != guestring.OK {
		t.rxBlocked(f, true)
		return false
	}
	t.buildHeaders(f, hdr, fl, seq, opts, nil, 0)
	w.Commit(0, &t.vh)
	f.flags &^= flAckDue
	t.rxBlocked(f, false)
	return true
}

// buildHeaders writes Ethernet, IP and TCP headers for a frame to the guest
// into hdr and the virtio-net header fields for it into t.vh (a table field,
// not a local: a pointer passed to the writer interface would escape).
func (t *Table) buildHeaders(f *conn, hdr []byte, fl header.TCPFlags, seq uint32, opts []byte, payload [][]byte, n int) {
	v6 := f.key.v6
	et := header.EtherTypeIPv4
	if v6 {
		et = header.EtherTypeIPv6
	}
	off := header.EncodeEthernet(hdr, header.MAC(f.guestMAC), header.MAC(t.cfg.OurMAC), et)
	tcpLen := header.TCPMinimumSize + len(opts)
	if v6 {
		off += header.EncodeIPv6(hdr[off:], &header.IPv6Fields{
			PayloadLength: uint16(tcpLen + n),
			NextHeader:    header.IPProtocolTCP,
			HopLimit:      64,
			Source:        f.remoteAddr,
			Destination:   f.guestAddr,
		})
	} else {
		off += header.EncodeIPv4(hdr[off:], &header.IPv4Fields{
			TotalLength: uint16(header.IPv4MinimumSize + tcpLen + n),
			Flags:       header.IPv4FlagDontFragment,
			TTL:         64,
			Protocol:    header.IPProtocolTCP,
			Source:      f.remoteAddr,
			Destination: f.guestAddr,
		})
	}
	ack := uint32(0)
	if fl.Has(header.TCPFlagACK) {
		ack = f.seqAckToGuest
	}
	wnd := f.wndToGuest >> f.wsToGuest
	if fl.Has(header.TCPFlagSYN) {
		wnd = min(f.wndToGuest, 0xffff) // RFC 7323: never scaled in a SYN
	}
	th := hdr[off : off+tcpLen]
	header.EncodeTCP(th, &header.TCPFields{
		SrcPort:    f.remotePort,
		DstPort:    f.guestPort,
		SeqNum:     seq,
		AckNum:     ack,
		Flags:      fl,
		WindowSize: uint16(min(wnd, 0xffff)),
		Options:    opts,
	})
	if fl.Has(header.TCPFlagACK) {
		f.ackSent = ack
		f.wndSent = f.wndToGuest
		if f.wndToGuest == 0 {
			f.wndSent = 0
		}
	}
	sent := min(wnd, 0xffff)
	if !fl.Has(header.TCPFlagSYN) {
		sent <<= f.wsToGuest
	}
	f.maxWndSent = max(f.maxWndSent, sent)
	psum := header.PseudoHeaderChecksum(header.IPProtocolTCP, f.remoteAddr, f.guestAddr, uint32(tcpLen+n))
	vh := &t.vh
	*vh = virtqueue.NetHdr{}
	if t.guestCsum {
		// Partial checksum: the guest (or its NIC emulation) completes it
		// from the pseudo-header sum, for free on local delivery.
		binary.BigEndian.PutUint16(th[16:18], psum)
		vh.Flags = virtqueue.NetHdrFNeedsCsum
		vh.CsumStart = uint16(off)
		vh.CsumOffset = 16
		if n > f.mssToGuest {
			vh.GSOType = virtqueue.GSOTCPv4
			if v6 {
				vh.GSOType = virtqueue.GSOTCPv6
			}
			vh.GSOSize = uint16(f.mssToGuest)
			vh.HdrLen = uint16(off + tcpLen)
		}
		return
	}
	sum := header.Checksum(th, psum)
	sum = header.ChecksumIovecs(payload, n, sum)
	binary.BigEndian.PutUint16(th[16:18], ^sum)
}

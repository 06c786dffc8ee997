package tcp

import (
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// Window policy: the ACK number and window the guest is given (from the
// host socket's send side and the remote peer's ACKs), STALLED and its
// window-clamp workaround, rewinds for retransmission.

// unstall implements DESIGN invariant 4 on a guest ACK or window opening:
// clear STALLED and read the socket right away (markDirty: the loop's
// output pass this iteration), not waiting for epoll. The window
// workaround went with the consume (reopenWindow).
func (t *Table) unstall(f *conn) {
	t.clearStalled(f)
	t.updateEpoll(f)
	t.markDirty(f)
}

// reopenWindow applies the TCP_WINDOW_CLAMP workaround to a connection's
// socket right after a guest ACK let bytes be consumed (MSG_TRUNC): the
// consume is what freed the space a zero window can reopen into. A socket
// may advertise a zero window whenever the guest holds everything it had
// to read (DESIGN's STALLED), and the flag does not always say so: it
// marks what an output pass found, and a sender silenced by the zero
// window raises no event to find it by; so every consuming ACK counts.
// It runs only where the kernel needs it (Table.clampNeeded, from
// hostsock.ProbeWindowKernel), in the one form that cannot shrink or lock
// the window (hostsock.ReapplyWindowClamp, where the kernels that help,
// do nothing or hurt are listed): at least the socket's clamp and the
// window it advertises, never zero, never before the consume. Attempts
// and the ones that moved the kernel's window state are counted apart.
func (t *Table) reopenWindow(f *conn) {
	if !t.clampNeeded || f.fd < 0 {
		return
	}
	t.stats.ClampAttempts.Add(1)
	v, out := hostsock.ReapplyWindowClamp(f.fd, &t.info)
	if out == hostsock.ClampSkipped {
		return
	}
	f.clamp = v
	if out == hostsock.ClampEffective {
		t.stats.ClampEffective.Add(1)
	}
}

// rewind makes the next output pass send again from the guest's last ACK.
func (t *Table) rewind(now time.Time, f *conn, cause stats.TCPRetransCause) {
	if f.inFlight() == 0 {
		return
	}
	if f.has(evGuestFinSent) && !f.has(evGuestFinAck) {
		f.events &^= evGuestFinSent
	}
	f.seqToGuest = f.seqAckFromGuest
	f.drained = false // what was in flight is to be read again
	f.recover = f.sndMax
	f.dupAcks = 0
	f.endSACKRecovery()
	f.stopRTT()
	f.tlp = 0
	f.flags &^= flZeroWnd
	if f.peekOff && f.fd >= 0 {
		if err := t.setPeekOff(f.fd, 0); err != nil {
			// The next peek would read past the bytes to send again
			// and hand the guest other bytes at their sequence.
			t.log.Debug("tcp SO_PEEK_OFF rewind failed: connection reset", "err", err)
			t.resetFlow(f, now, stats.TCPError)
			return
		}
	}
	t.stats.Retransmits[cause].Add(1)
	if t.clearStalled(f) {
		t.updateEpoll(f)
	}
	t.markDirty(f)
}

// acksFollowPeer reports whether f's ACKs to the guest follow what the host
// peer acknowledged (tcpi_bytes_acked) rather than what was written to the
// socket (refreshAckWnd).
func (t *Table) acksFollowPeer(f *conn) bool {
	return !t.cfg.AckOnWrite && (f.flags&flLocal == 0 || t.cfg.AckOnPeerAck)
}

// windowUpdateDue reports whether the window we advertise grew enough since
// the last frame to be worth a frame of its own. Shrinking is never
// announced: the guest finds out with the next frame. Nor is growth while
// the window the guest has leaves it a full segment and half the window
// to send: nothing holds it back, and the next frame (at the latest a
// delayed ACK's, which goes at once once half the window is used) carries
// the new window. Every connection starts so, as between two kernels: the
// SYN-ACK's window cannot be scaled, and announcing the scaled one after
// the handshake cost the guest a frame per connection.
func (t *Table) windowUpdateDue(f *conn) bool {
	if f.wndToGuest <= f.wndSent || f.wndToGuest>>f.wsToGuest == f.wndSent>>f.wsToGuest {
		return false
	}
	left := int64(f.wndSent) - int64(f.seqFromGuest-f.ackSent)
	if left >= int64(max(f.wndSent/2, f.guestMSS())) {
		return false
	}
	return f.wndSent < uint32(2*f.mssToGuest) || f.wndToGuest-f.wndSent >= f.wndSent/2
}

// refreshAckWnd updates the ACK number and window we give the guest from
// the host socket (DESIGN invariants 5 and 7): TCP_INFO, then SO_MEMINFO,
// unless the decision needs neither (syscall_hints.go).
func (t *Table) refreshAckWnd(now time.Time, f *conn) {
	if f.fd < 0 {
		f.seqAckToGuest = f.seqFromGuest
		return
	}
	if f.has(evGuestFin) && !f.oooReady() {
		t.finAckWnd(f)
		return
	}
	handshake := f.state == stats.TCPSynAckSent || f.state == stats.TCPSynSent
	// Where the peer is remote, ACK what it acknowledged, so the guest
	// feels the end-to-end backpressure. Otherwise written to the socket
	// is good enough: the local peer's kernel has it (or the guest closed
	// and must not wait for the peer).
	followPeer := t.acksFollowPeer(f) && !f.has(evGuestFin)
	info := t.takeConnectInfo(f)
	if info == nil {
		info = t.readInfo(f)
	}
	// SO_MEMINFO after TCP_INFO, as sendSpace's payload ratio assumes: the
	// other way round, bytes acknowledged between the reads make the
	// queue's payload look small against its memory, and a ratio taken
	// too low shrinks the window below the guest's MSS with nothing
	// queued to reopen it (an upload stalled on the rig's small-buffer
	// test).
	sndbuf, wq, memOK := t.readMemory(f)
	peerAcks := false
	if info == nil || !followPeer {
		f.seqAckToGuest = f.seqFromGuest
	} else {
		peerAcks = true
		a := f.ackBase + uint32(info.Bytes_acked)
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
	peerWnd := uint32(maxWindow)
	queued, sndMSS := 0, 0
	if info != nil {
		peerWnd = info.Snd_wnd
		if handshake && peerWnd == 0 {
			peerWnd = 65535
		}
		// Bytes in our send queue, unsent or unacknowledged (SIOCOUTQ,
		// without the system call): written minus acknowledged.
		queued = max(int(int32(f.seqFromGuest-f.ackBase-uint32(info.Bytes_acked))), 0)
		sndMSS = int(info.Snd_mss)
	} else {
		queued = hostsock.SendQueued(f.fd)
	}
	space, full := t.sendSpace(now, f, sndbuf, wq, memOK, queued, sndMSS)
	wnd := min(uint32(space), uint32(0xffff)<<f.wsToGuest, t.ringBudget(now, f))
	if handshake || peerAcks {
		// Mirror the peer's window where ACKs follow the peer (and in the
		// handshake, before anything was written). Where ACKs follow our
		// writes the send buffer alone decides: the kernel queues what the
		// peer cannot take yet, and a window held down by tcpi_snd_wnd
		// would have no wake-up when the peer reopens it.
		wnd = min(wnd, peerWnd)
	}
	f.wndToGuest = wnd
	f.wndEdgeSpan = 0
	if info != nil && !peerAcks && !full && t.txRing == 0 && f.flags&flWantOut == 0 && !f.oooReady() {
		// wndHolds. The handshake's window too: nothing was written yet,
		// and the peer's window only made it smaller, so the guest's
		// first request needs no refresh (syscall_hints.go).
		f.wndEdgeSpan = wnd
	}
	if handshake {
		f.sendIdle = false
		return
	}
	// Everything acknowledged, a window the guest can use that neither
	// the peer nor the ring budget holds down, and nothing queued, or for
	// a local peer little enough that its draining cannot make a window
	// update due: until the guest sends again (seqFromGuest moves), a
	// refresh would find the same or a window a little larger, not worth
	// a frame (syscall_hints.go).
	f.sendIdle = info != nil && (queued == 0 || f.queuedIdle(queued, wnd, peerAcks)) && !full && f.seqAckToGuest == f.seqFromGuest &&
		wnd >= f.guestMSS() && (!peerAcks || peerWnd >= uint32(space)) && t.txRing == 0 &&
		f.flags&flWantOut == 0 && !f.oooReady()
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
	} else if f.flags&flWantOut != 0 && !f.oooReady() {
		// (Kept data waiting for the socket keeps EPOLLOUT: only the
		// socket's room brings it out.)
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

// sndBufRefresh is how often a connection's SO_SNDBUF is re-read.
const sndBufRefresh = 100 * time.Millisecond

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
// the ratio of one skb per guest segment (sndMSS, the socket's
// tcpi_snd_mss, bounds how much one skb carries). The kernel accepts a
// write while any memory is free, so the estimate errs on the safe side
// (DESIGN invariant 5): the guest never has more in flight than the socket
// takes. sndbuf and wq are SO_MEMINFO's, read by the caller after queued
// (ok false: it could not be read).
func (t *Table) sendSpace(now time.Time, f *conn, sndbuf, wq int, ok bool, queued, sndMSS int) (space int, full bool) {
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

package tcpstack

import (
	"vunet/tcpstack/guestring"
	"vunet/tcpstack/stats"
)

// Frames for the guest: every producer writes through the loop's RX
// writer (guestring.Writer) once per iteration, link-service replies
// first, then TCP, then the datagram flows; the iteration publishes them
// with one used-ring update.

// produceRX lets every producer of frames for the guest write what it has:
// link-service replies first (they are few and unblock guests), then flows.
func (l *loop) produceRX() (more bool) {
	l.deliverPending()
	l.tcpOutput()
	return l.datagramOutput()
}

// datagramOutput delivers the datagram flows' queued data. A flush that ran
// out of descriptors with sockets still queued leaves them for the refill,
// and is counted in RXWaitedForDescriptors as tcpOutput counts its own:
// once per wait. (A batch receive reserves for more datagrams than the
// socket may hold: running dry with every socket drained is no wait.)
// Uncounted, a UDP stream whose host socket overflowed while the guest's
// ring was dry showed no wait at all, and its loss looked like the
// back-end's.
func (l *loop) datagramOutput() (more bool) {
	starved := l.out.Starved()
	frames := l.st.RX.Frames.Load()
	more = l.flows.Flush(l.now, l.out)
	if !l.out.Starved() || !l.flows.Waiting() {
		l.dgRXWait = false
		return more
	}
	l.countRXWait(&l.dgRXWait, starved, frames)
	return more
}

// countRXWait counts a producer's pass that ran out of RX descriptors in
// RXWaitedForDescriptors, once per wait: when it starts the wait (*waiting
// was false) or when it used buffers the guest posted (frames moved since
// the pass began) and ran out again. A ring an earlier producer ran dry
// in this iteration (starved on entry) is that producer's wait.
func (l *loop) countRXWait(waiting *bool, starved bool, frames uint64) {
	if !starved && (!*waiting || l.st.RX.Frames.Load() != frames) {
		l.st.RXWaitedForDescriptors.Add(1)
	}
	*waiting = true
}

// queueReply makes the frame just built in l.pending.next() pending. A full
// ring first hands its replies to the guest: one TX batch of requests
// (ARP, NDP, DHCP) can ask for more replies than the ring holds, and only
// a guest that posts no RX buffers should lose any.
func (l *loop) queueReply(n int) {
	if l.pending.len() == pendingReplies {
		l.deliverPending()
	}
	if l.pending.commit(n) {
		l.st.RX.Drops[stats.DropPendingOverflow].Add(1)
	}
}

// deliverPending writes pending replies to the guest until none is left or the
// RX ring runs out of buffers (the reply stays, the loop retries on refill).
func (l *loop) deliverPending() {
	for l.pending.len() > 0 {
		p := l.pending.front()
		if !l.qp.RXEnabled {
			l.st.RX.Drops[stats.DropRingDisabled].Add(1)
			l.pending.pop()
			continue
		}
		switch l.out.WriteFrame(p.buf[:p.n], 0) {
		case guestring.OK:
			if p.announce && p.svc == stats.SvcNDP {
				l.raDelivered()
			}
			l.popPending(p)
		case guestring.NoFit:
			l.st.RX.Drops[stats.DropNoFit].Add(1)
			l.popPending(p)
		case guestring.Broken:
			l.st.RX.Drops[stats.DropQueueBroken].Add(1)
			l.popPending(p)
		case guestring.NoDesc:
			if !p.waited {
				p.waited = true
				l.st.RXWaitedForDescriptors.Add(1)
			}
			return
		default: // Limited: try again next iteration
			return
		}
	}
}

// popPending removes p, the front pending reply, once it went out or was
// dropped. An announcement counts as its service's reply only now (see
// queueAnnouncement).
func (l *loop) popPending(p *pendingReply) {
	if p.announce {
		l.st.ServiceReplies[p.svc].Add(1)
		if p.svc == stats.SvcNDP {
			l.st.Proto.RouterAdverts.Add(1)
		}
	}
	l.pending.pop()
}

// tcpOutput runs the TCP output pass into the RX ring. A pass blocked on
// descriptors has already marked the writer starved (iterate then enables
// RX kicks), and the blocked flows stay queued in the table: the guest's
// refill kick brings the loop back and its next pass serves them first,
// with no timer in between (DESIGN invariant 1).
//
// A blocked pass is counted in RXWaitedForDescriptors once per wait, not
// per retry: when it starts the wait (the previous pass was not blocked),
// or when it used buffers the guest posted and ran out again. A pass that
// found the ring already drained by an earlier producer in this iteration
// (a pending reply, counted there) adds nothing.
func (l *loop) tcpOutput() {
	if m := l.s.MTU(); m != l.mtu {
		l.mtu = m
		l.tcp.SetMTU(m)
	}
	starved := l.out.Starved()
	frames := l.st.RX.Frames.Load()
	if !l.tcp.Flush(l.now, l.out) {
		l.tcpRXWait = false
		return
	}
	if !l.out.Starved() {
		return // our own reservation limit, not the guest's ring: iterate comes back at once
	}
	l.countRXWait(&l.tcpRXWait, starved, frames)
}

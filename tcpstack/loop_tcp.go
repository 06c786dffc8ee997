package tcpstack

import (
	"time"

	"vunet/virtqueue"
)

// The loop's side of TCP translation: the tcpTable (tcp_*.go) does the
// protocol; the loop feeds it guest segments, socket events and timer ticks,
// and lends it the RX writer for its output pass.

// attachTCP hands the pair's connections to this loop: their sockets join
// its epoll set, and they learn the guest's offloads and MTU.
func (l *loop) attachTCP() {
	f := l.qp.Features
	l.tcp.Attach(l.ep)
	l.tcp.SetFeatures(l.guestCsum,
		virtqueue.HasFeature(f, virtqueue.FeatureNetGuestTSO4),
		virtqueue.HasFeature(f, virtqueue.FeatureNetGuestTSO6))
	l.mtu = l.s.MTU()
	l.tcp.SetMTU(l.mtu)
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
	starved := l.rx.Starved()
	frames := l.st.RX.Frames.Load()
	if !l.tcp.Flush(l.now, &l.rx) {
		l.tcpRXWait = false
		return
	}
	if !l.rx.Starved() {
		return // our own reservation limit, not the guest's ring: iterate comes back at once
	}
	if !starved && (!l.tcpRXWait || l.st.RX.Frames.Load() != frames) {
		l.st.RXWaitedForDescriptors.Add(1)
	}
	l.tcpRXWait = true
}

// tcpDeadline is the TCP table's next timer, zero for none.
func (l *loop) tcpDeadline() time.Time { return l.tcp.NextTimer() }

package tcpstack

import (
	"time"

	"vunet/tcpstack/stats"
)

// Link-service replies wait in a small ring for guest RX buffers; the
// link announcements of a pair start go through it too.

// Sizes of the pending reply ring. Link-service replies (ARP, DHCP, DHCPv6,
// NDP, ICMP echo replies) are small; a guest that stops refilling its RX ring
// must not make us queue without bound, so the ring is fixed and the oldest
// reply gives way.
const (
	pendingReplies   = 32
	pendingReplySize = 2048
)

// pendingReply is one frame (Ethernet onward) waiting for RX descriptors.
type pendingReply struct {
	n      int
	waited bool // already counted in RXWaitedForDescriptors
	// announce: a link announcement (gratuitous ARP, unsolicited RA) of
	// service svc, made again at every pair start: counted as a service
	// reply when delivered, and not a drop when discarded at stop.
	announce bool
	svc      stats.Service
	buf      [pendingReplySize]byte
}

// replyRing is a preallocated FIFO of reply frames. It has one more slot than
// its capacity so a service always has a free buffer to write into before we
// know whether it produces a reply at all.
type replyRing struct {
	slots       [pendingReplies + 1]pendingReply
	head, count int
}

// next returns the buffer the next reply is built in; commit makes it pending.
func (r *replyRing) next() []byte {
	return r.slots[(r.head+r.count)%len(r.slots)].buf[:]
}

// commit queues the frame of length n built in next(). When the ring is full
// the oldest reply is dropped and commit returns true.
func (r *replyRing) commit(n int) (droppedOldest bool) {
	if n <= 0 {
		return false
	}
	s := &r.slots[(r.head+r.count)%len(r.slots)]
	s.n = n
	s.waited = false
	s.announce = false
	if r.count == pendingReplies {
		r.head = (r.head + 1) % len(r.slots)
		droppedOldest = true
	} else {
		r.count++
	}
	return droppedOldest
}

func (r *replyRing) len() int { return r.count }

// markLastAnnouncement marks the newest pending reply as a link
// announcement of service svc.
func (r *replyRing) markLastAnnouncement(svc stats.Service) {
	if r.count > 0 {
		s := &r.slots[(r.head+r.count-1)%len(r.slots)]
		s.announce, s.svc = true, svc
	}
}

// replies counts the pending replies that are not announcements.
func (r *replyRing) replies() int {
	n := 0
	for i := 0; i < r.count; i++ {
		if !r.slots[(r.head+i)%len(r.slots)].announce {
			n++
		}
	}
	return n
}

// front returns the oldest pending reply; only valid when len() > 0.
func (r *replyRing) front() *pendingReply { return &r.slots[r.head] }

func (r *replyRing) pop() {
	if r.count == 0 {
		return
	}
	r.head = (r.head + 1) % len(r.slots)
	r.count--
}

// raInterval is how often an unsolicited Router Advertisement refreshes the
// guest's default route (the RA's router lifetime is 9000s).
const raInterval = 10 * time.Minute

// announceLink queues what a guest that may have missed our earlier answers
// needs after a (re)start of the pair: a gratuitous ARP for the gateway, so
// a stale neighbour entry is replaced, and a Router Advertisement.
//
// With the RX ring disabled nothing is queued (it would only be counted as
// a ring_disabled drop): the control plane restarts the pair when the
// guest enables the ring, and that start announces. An announcement still
// pending when the pair stops (the guest had posted no RX buffer yet) is
// discarded without counting either: the next start queues a fresh one.
func (l *loop) announceLink() {
	if !l.qp.RXEnabled {
		return
	}
	cfg := &l.s.cfg.Addr
	if cfg.IPv4.Gateway.Is4() && !cfg.Disable4 {
		if n := l.link.GratuitousARP(l.pending.next()); n > 0 {
			l.queueAnnouncement(n, stats.SvcARP)
		}
	}
	l.sendRA()
}

// queueAnnouncement makes the announcement of service svc just built in
// l.pending.next() pending, marked as one (see announceLink). It is
// counted as the service's reply when it reaches the guest
// (deliverPending), so every counted reply is delivered or dropped.
func (l *loop) queueAnnouncement(n int, svc stats.Service) {
	l.queueReply(n)
	l.pending.markLastAnnouncement(svc)
}

// sendRA queues an unsolicited Router Advertisement when the guest has an
// IPv6 prefix to learn, and schedules the next one.
func (l *loop) sendRA() {
	cfg := &l.s.cfg.Addr
	if !cfg.IPv6.Addr.IsValid() || cfg.Disable6 || cfg.NoNDP || cfg.NoRA {
		return
	}
	if n := l.link.RouterAdvert(l.pending.next()); n > 0 {
		l.queueAnnouncement(n, stats.SvcNDP)
	}
	l.nextRA = time.Now().Add(raInterval)
}

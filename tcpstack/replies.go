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

// Unsolicited Router Advertisements follow RFC 4861 6.2.4: a few at short
// intervals once the guest's link is up, then one every raInterval.
//
// The first one, queued at the pair start, reaches the guest the moment
// its driver posts RX buffers, which a Linux guest does when the interface
// is opened — before the kernel calls the link ready (linkwatch, up to a
// second later). An address it would configure from that RA starts
// duplicate address detection on a link that is not ready, and Linux
// drops it ("If the device is not ready ... otherwise, kill it",
// addrconf_dad_begin). The guest then depends on its own Router
// Solicitation alone, which it sends only after its link-local address
// passed DAD and never again once that address is gone (a DHCP script
// that flushes every address of the interface takes it; seen in the e2e
// guest). The initial RAs that follow reach it when its link is ready.
const (
	// raInterval is how often an unsolicited Router Advertisement
	// refreshes the guest's default route (the RA's router lifetime is
	// 9000s).
	raInterval = 10 * time.Minute
	// initialRAs is how many unsolicited RAs go out at initial intervals
	// after a pair start, the first included
	// (MAX_INITIAL_RTR_ADVERTISEMENTS).
	initialRAs = 3
	// initialRAGap is the gap between the delivery of the first RA and the
	// second; it doubles for the next (RFC 4861 caps it at 16 s).
	initialRAGap = 2 * time.Second
)

// announceLink queues what a guest that may have missed our earlier answers
// needs after a (re)start of the pair: a gratuitous ARP for the gateway, so
// a stale neighbour entry is replaced, and a Router Advertisement, the
// first of initialRAs.
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
	l.raInitial, l.raGap = initialRAs-1, initialRAGap
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

// raDelivered schedules the next initial RA once an unsolicited one has
// reached the guest: counted from the delivery, not from when it was
// queued, since a guest may post its first RX buffers long after the pair
// started (the boot), and RAs queued meanwhile would all arrive at once.
func (l *loop) raDelivered() {
	if l.raInitial <= 0 {
		return
	}
	l.raInitial--
	l.nextRA = time.Now().Add(l.raGap)
	l.raGap *= 2
}

package tcpstack

import (
	"time"

	"vunet/tcpstack/stats"
)

// Link announcements: what the loop tells the guest on its own, through
// the link services (package linksvc) and the pending reply ring.

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

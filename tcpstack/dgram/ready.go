package dgram

import (
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/hostsock"
)

// The ready queue: sockets epoll reported readable wait in Table.readyQ
// until Flush turns their datagrams into guest frames.

// Attach registers every open socket with a new loop's epoll set. The
// sockets are also queued as ready: data may have arrived meanwhile.
func (ft *Table) Attach(ep *hostsock.Epoll, now time.Time) {
	ft.ep = ep
	ft.now = now
	for i := range ft.flows {
		f := &ft.flows[i]
		if !f.inUse {
			continue
		}
		if err := ep.Add(f.fd, unix.EPOLLIN|unix.EPOLLET, ft.token(int32(i))); err != nil {
			ft.log.Warn("re-register flow socket, flow closed", "err", err)
			ft.closeFlow(int32(i))
			continue
		}
		ft.enqueue(int32(i))
	}
	ft.attachForwards(ep)
}

// Detach forgets the epoll set of a loop that ended (closing it removed the
// registrations).
func (ft *Table) Detach() { ft.ep = nil }

func (ft *Table) enqueue(i int32) {
	f := &ft.flows[i]
	if f.queued || ft.rCount == len(ft.readyQ) {
		return
	}
	f.queued = true
	ft.readyQ[(ft.rHead+ft.rCount)%len(ft.readyQ)] = i
	ft.rCount++
}

// Ready handles an epoll event of one of the table's sockets: a flow's
// (hostsock.OwnerUDP, OwnerICMP) or a forwarded port's (OwnerUDPForward).
func (ft *Table) Ready(tok hostsock.Token) {
	if tok.Owner() == hostsock.OwnerUDPForward {
		ft.forwardReady(tok)
		return
	}
	i, gen := int32(tok.Slot()), tok.Gen()
	if i < 0 || int(i) >= len(ft.flows) {
		return
	}
	f := &ft.flows[i]
	if !f.inUse || f.gen&hostsock.GenMask != gen {
		return // stale event for a closed or reused slot
	}
	ft.enqueue(i)
}

// Waiting reports whether sockets (or forwarded ports) are still queued
// with data for the guest: after a Flush whose writer ran out of
// descriptors, they wait for the guest's refill.
func (ft *Table) Waiting() bool { return ft.rCount > 0 || ft.fwdPending }

// Flush delivers queued sockets' data to the guest through w. It returns
// true when work is left that does not depend on the guest (budget used
// up); when the guest's buffers ran out, everything stays queued for the
// refill.
func (ft *Table) Flush(now time.Time, w guestring.Sink) (more bool) {
	ft.now = now
	if ft.fwdPending {
		var blocked bool
		if more, blocked = ft.flushForwards(w); blocked {
			return more
		}
	}
	for n := ft.rCount; n > 0 && ft.rCount > 0; n-- {
		i := ft.readyQ[ft.rHead]
		f := &ft.flows[i]
		if !f.inUse {
			f.queued = false
			ft.rHead = (ft.rHead + 1) % len(ft.readyQ)
			ft.rCount--
			continue
		}
		var r flowRead
		switch f.key.kind {
		case flowUDP:
			r = ft.readUDP(w, i)
		case flowICMP:
			r = ft.readICMP(w, i)
		}
		switch r {
		case flowDrained:
			f.queued = false
			ft.rHead = (ft.rHead + 1) % len(ft.readyQ)
			ft.rCount--
		case flowBudgetUsed:
			// To the back of the queue.
			ft.rHead = (ft.rHead + 1) % len(ft.readyQ)
			ft.readyQ[(ft.rHead+ft.rCount-1)%len(ft.readyQ)] = i
			more = true
		case flowBlocked:
			return more // the guest has no buffers: everything waits for the refill
		}
	}
	return more
}

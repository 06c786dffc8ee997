package tcp

import "time"

// The guest's TX ring budget.
//
// Data the guest has in flight towards us sits in the pair's TX ring until
// the loop takes it. A virtio guest whose ring is full stops its queue and
// waits; a front-end that bridges a source it cannot hold back — DPDK's
// testpmd forwarding a TAP in io mode, virtio-user in front of anything —
// drops what the ring has no room for. And a frame lost on the way costs a
// TCP sender far more here than on a wire: the connection's data must
// reach the host socket in order, so everything behind the hole is dropped
// too until the guest resends it, which a sender without SACK does one
// segment per round trip, then by retransmission timeout. (Measured with
// testpmd: a few hundred lost frames per burst, guest→host 15–50 Mbit/s
// against 2–4 Gbit/s the other way.)
//
// So the window a connection is given never invites more than its share of
// the ring: 7/16 of the ring's descriptors (half, as a driver may put the
// virtio-net header in a descriptor of its own and testpmd posts at most
// 512 of a 1024-entry ring, less an eighth of that for frames the window
// does not cover: segments shorter than the MSS by their TCP options, ARP,
// other connections' ACKs) times the segment size, split between the
// connections that sent data lately. Only front-ends without HOST_TSO4/6 get a budget:
// with TSO a frame carries up to 64 KiB and the ring holds more than any
// window we give.

// senderPeriod is how long a connection that wrote guest data counts as a
// sender sharing the ring budget (it stays counted up to twice that).
const senderPeriod = 100 * time.Millisecond

// minBudgetSegments is the smallest share a sender gets: a Linux sender
// puts nothing into a window smaller than one segment.
const minBudgetSegments = 2

// senderCount counts the connections that wrote guest data in the current
// and the previous senderPeriod, without walking the table.
type senderCount struct {
	period    int64 // now / senderPeriod of cur
	cur, prev int
}

// SetTXRing gives the table the size of the guest's TX ring, in
// descriptors, for the window budget; 0 (front-ends with TSO) means no
// budget.
func (t *Table) SetTXRing(size int) { t.txRing = max(size, 0) }

// noteSender counts f as a sender now (it wrote guest data to its socket).
func (t *Table) noteSender(now time.Time, f *conn) {
	p := now.UnixNano() / int64(senderPeriod)
	s := &t.senders
	if p != s.period {
		if p == s.period+1 {
			s.prev = s.cur
		} else {
			s.prev = 0
		}
		s.cur, s.period = 0, p
	}
	if f.senderPeriod != p {
		f.senderPeriod = p
		s.cur++
	}
}

// sendersNow is how many connections share the ring budget now.
func (t *Table) sendersNow(now time.Time) int {
	p := now.UnixNano() / int64(senderPeriod)
	s := &t.senders
	switch p {
	case s.period:
		return max(s.cur, s.prev)
	case s.period + 1:
		return s.cur
	}
	return 0
}

// ringBudget is the most f's window may be: its share of the TX ring, in
// bytes of segments; maxWindow without a budget.
func (t *Table) ringBudget(now time.Time, f *conn) uint32 {
	if t.txRing == 0 {
		return maxWindow
	}
	segs := max(t.txRing*7/16/max(t.sendersNow(now), 1), minBudgetSegments)
	return uint32(min(segs*f.mssToGuest, maxWindow))
}

package dgram

// Flow classes and their least-recently-used lists. A full class makes
// room by closing its own least recently used flow, in O(1): the flows of
// a class are linked through flow.prev and flow.next in the order of their
// last use, least recent first, and a flow moves to the back whenever it
// is used.
//
// Two classes keep remote peers from pushing out the guest's own flows:
// flows the guest opened (its DNS queries, its UDP and ping traffic) may
// fill Config.MaxFlows; flows opened for peers of a forwarded UDP port —
// one per peer address and port, which anyone who can reach the port
// picks at will — have a quota of their own, Config.MaxInboundFlows, and
// evict only each other.

// flowClass says who opened a flow.
type flowClass uint8

const (
	classGuest   flowClass = iota // the guest's datagram to a remote opened it
	classInbound                  // a forwarded port's peer opened it
	numClasses
)

// lruList is one class's flows, least recently used first.
type lruList struct {
	head, tail int32 // -1: empty
	n          int
}

func (l *lruList) init() { l.head, l.tail = -1, -1 }

// lruAppend puts slot i at the back of its class's list (most recent).
func (ft *Table) lruAppend(i int32) {
	f := &ft.flows[i]
	l := &ft.lru[f.class]
	f.prev, f.next = l.tail, -1
	if l.tail >= 0 {
		ft.flows[l.tail].next = i
	} else {
		l.head = i
	}
	l.tail = i
	l.n++
}

// lruRemove takes slot i out of its class's list.
func (ft *Table) lruRemove(i int32) {
	f := &ft.flows[i]
	l := &ft.lru[f.class]
	if f.prev >= 0 {
		ft.flows[f.prev].next = f.next
	} else {
		l.head = f.next
	}
	if f.next >= 0 {
		ft.flows[f.next].prev = f.prev
	} else {
		l.tail = f.prev
	}
	f.prev, f.next = -1, -1
	l.n--
}

// touch records a use of flow i now: it becomes its class's most recent.
func (ft *Table) touch(i int32) {
	f := &ft.flows[i]
	f.lastUsed = ft.now
	if ft.lru[f.class].tail != i {
		ft.lruRemove(i)
		ft.lruAppend(i)
	}
}

// quota is how many flows class c may hold.
func (ft *Table) quota(c flowClass) int {
	if c == classInbound {
		return ft.cfg.MaxInboundFlows
	}
	return ft.cfg.MaxFlows
}

// makeRoom closes class c's least recently used flow when the class is at
// its quota, counted as an eviction. It reports whether it closed one.
func (ft *Table) makeRoom(c flowClass) bool {
	l := &ft.lru[c]
	if l.n < ft.quota(c) || l.head < 0 {
		return false
	}
	p := ft.flows[l.head].key.kind.proto()
	ft.closeFlow(l.head)
	ft.st.Flows.Evicted[p].Add(1)
	return true
}

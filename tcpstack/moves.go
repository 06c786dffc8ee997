package tcpstack

import (
	"log/slog"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/flowdir"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// Flows belong to the guest, not to a queue pair. Each pair's loop keeps
// its flows in tables of its own and touches no other pair's (no locks
// between pairs), but a guest moves a socket from one TX queue to another
// (Linux re-picks the queue by XPS when the socket's thread runs on
// another vCPU, once nothing of it is in flight). So a flow follows the
// guest: it is handed over, whole, to the pair whose TX queue its next
// frame came on, and from then on that pair's loop translates it both
// ways, its frames to the guest going out on that pair's RX queue (what
// virtio calls automatic receive steering: RX follows the flow's last TX
// queue).
//
//   - The tables publish their flows in the directory (package flowdir):
//     per pair a set of key fingerprints, written by that pair only, read
//     by every pair without a lock. A table consults it only for a frame
//     whose flow it lacks — never for a frame of its own flows, so the
//     per-frame path is what it was.
//   - A frame whose flow another pair holds is not answered (no RST, no
//     second socket): the loop claims the flow in its own shard, posts a
//     request to the holder's mailbox (a lock-free queue, mailbox.go) and
//     keeps the frame — its TX chain stays popped, so the chains after it
//     wait with it and a flow's frames are handled in the order the guest
//     queued them. The chain goes back on its own TX queue, as always.
//   - The holder answers after its own TX work (the guest's earlier frames
//     of the flow on the old queue go first) and after publishing its RX
//     ring (the flow's frames it sent reach the guest before any the new
//     owner sends): it gives the flow away (tcp.Table.HandOff,
//     dgram.Table.HandOff: the live-migration encoding, and the same open
//     socket, out of its epoll set), or says it has none.
//   - The asking loop imports the flow (tcp.Table.Import,
//     dgram.Table.Import), and hands the waiting frame in again. Told
//     "none", it asks the next pair the directory names, and with none
//     left handles the frame as one of an unknown flow.
//
// A claim stays in the claimant's shard until the flow arrived or nobody
// has it, so at any moment some shard names the flow, even in transit. A
// frame waits at most fetchWait (the holder's loop is stopped for a ring
// change, say): then it is dropped and counted (DropFlowMoving) and the
// guest's retransmission finds the flow here, or asks again.

// fetchWait bounds how long a guest frame waits for its flow to come from
// another pair before it is dropped.
const fetchWait = 200 * time.Millisecond

// claimWait bounds how long a fetch stays open without an answer (the
// holder's loop is stopped); an answer after it is still taken.
const claimWait = 2 * time.Second

// maxClaims bounds the fetches a pair has open at once; a frame that would
// need one more is dropped (a guest that spreads one flow over several
// queues at once gets there, and only hurts itself).
const maxClaims = 32

// maxWants bounds the requests a pair keeps waiting (for flows it is
// fetching itself); more are answered "none".
const maxWants = 64

// claim is a fetch in progress: the pair asked owner for flow fp.
type claim struct {
	kind  moveKind
	fp    uint64
	owner int
	since time.Time
	asked flowdir.Pairs // pairs that answered "none"
}

// txFetch is the TX side's state around a frame whose flow is elsewhere;
// the frame is the chain at txPath.next, kept popped.
type txFetch struct {
	fetchable bool      // dispatching a chain that can wait (not a reassembled datagram)
	waiting   bool      // the chain waits for flow fp
	fp        uint64    //
	until     time.Time // when the wait gives up
	replay    bool      // hand the chain in again: its flow came, or nobody has it
	drop      bool      // give the chain back unhandled: the wait gave up
	noFetch   uint64    // the replayed frame's flow, which nobody had: not fetched again
	resume    bool      // TX work is due although no kick came
}

// pairDir is a pair's table's window on the directory: it implements
// tcp.Directory and dgram.Directory over the pair's shard.
type pairDir struct {
	ps   *pairState
	kind moveKind
}

func (d *pairDir) Sum(key [38]byte) uint64 { return d.ps.shard.Dir().Sum(key[:]) }
func (d *pairDir) Add(fp uint64)           { d.ps.shard.Add(fp) }
func (d *pairDir) Remove(fp uint64)        { d.ps.shard.Remove(fp) }

// Fetch is asked, on the pair's loop, for a frame whose flow the table
// lacks.
func (d *pairDir) Fetch(fp uint64) bool {
	l := d.ps.loop
	return l != nil && l.fetch(d.kind, fp)
}

// Held reports whether another pair's shard names fp.
func (d *pairDir) Held(fp uint64) bool {
	_, ok := d.ps.shard.Dir().Find(fp, &d.ps.self)
	return ok
}

// post puts m in pair to's mailbox; false when it has none or it is full.
func (s *Stack) post(to int, m moveMsg) bool {
	if to < 0 || to >= flowdir.MaxPairs {
		return false
	}
	ps := s.byIndex[to].Load()
	return ps != nil && ps.mail.post(m)
}

// fetch decides about a frame whose flow (kind, fp) the pair's table
// lacks: true when another pair holds it and the frame now waits for it
// (or, if it cannot wait, was dropped while the flow is fetched).
func (l *loop) fetch(kind moveKind, fp uint64) bool {
	f := &l.tx.fetch
	if fp == f.noFetch {
		return false
	}
	ps := l.ps
	if ps.claimIndex(fp) < 0 {
		owner, ok := l.s.dir.Find(fp, &ps.self)
		if !ok {
			return false // nobody has it: a frame of an unknown flow
		}
		if !l.claim(kind, fp, owner, flowdir.Pairs{}) {
			l.st.TX.Drops[stats.DropFlowMoving].Add(1)
			return true
		}
	}
	if !f.fetchable || l.stream != nil {
		// A reassembled datagram: its fragments' chains are gone (and a
		// stream's frame has no chain to keep). The flow comes here all
		// the same, for the guest's next datagram.
		l.st.TX.Drops[stats.DropFlowMoving].Add(1)
		return true
	}
	f.waiting, f.fp, f.until = true, fp, l.now.Add(fetchWait)
	return true
}

// claim asks owner for flow fp, claiming it in the pair's shard first (so
// that some shard names the flow while it is on its way).
func (l *loop) claim(kind moveKind, fp uint64, owner int, asked flowdir.Pairs) bool {
	ps := l.ps
	if len(ps.claims) >= maxClaims {
		return false
	}
	ps.shard.Add(fp)
	if !l.s.post(owner, moveMsg{op: moveWant, kind: kind, from: l.qp.Index, fp: fp}) {
		ps.shard.Remove(fp)
		return false
	}
	ps.claims = append(ps.claims, claim{kind: kind, fp: fp, owner: owner, since: l.now, asked: asked})
	l.st.FlowFetches.Add(1)
	return true
}

// claimIndex is the index of the open fetch of fp, -1 for none.
func (ps *pairState) claimIndex(fp uint64) int {
	for i := range ps.claims {
		if ps.claims[i].fp == fp {
			return i
		}
	}
	return -1
}

// unclaim ends the fetch of fp, if open.
func (ps *pairState) unclaim(fp uint64) {
	if i := ps.claimIndex(fp); i >= 0 {
		ps.shard.Remove(fp)
		last := len(ps.claims) - 1
		ps.claims[i] = ps.claims[last]
		ps.claims = ps.claims[:last]
	}
}

// readMail takes every message waiting in the pair's mailbox: flows given
// to it, answers, and requests (kept for serveWants, after the TX work).
func (l *loop) readMail() {
	ps := l.ps
	for {
		m, ok := ps.mail.take()
		if !ok {
			return
		}
		switch m.op {
		case moveGive:
			l.takeFlow(m)
		case moveNone:
			l.noFlow(m)
		case moveWant:
			if len(ps.wants) < maxWants {
				ps.wants = append(ps.wants, m)
			} else {
				l.s.post(m.from, moveMsg{op: moveNone, kind: m.kind, from: l.qp.Index, fp: m.fp})
			}
		}
	}
}

// takeFlow imports a flow another pair gave this one; a frame waiting for
// it is handed in again.
func (l *loop) takeFlow(m moveMsg) {
	ok := l.ps.importFlow(l.now, m, l.log)
	l.ps.unclaim(m.fp)
	f := &l.tx.fetch
	if f.waiting && f.fp == m.fp {
		f.waiting, f.replay, f.resume = false, true, true
		if !ok {
			f.noFetch = m.fp
		}
	}
}

// noFlow takes a "none": the next pair the directory names is asked, or,
// with nobody left, a frame waiting for the flow is handled as one of an
// unknown flow.
func (l *loop) noFlow(m moveMsg) {
	ps := l.ps
	i := ps.claimIndex(m.fp)
	if i < 0 {
		return // a fetch that gave up already
	}
	l.st.FlowFetchMisses.Add(1)
	c := ps.claims[i]
	c.asked.Add(m.from)
	skip := c.asked
	skip.Add(l.qp.Index)
	ps.unclaim(m.fp)
	if owner, ok := l.s.dir.Find(m.fp, &skip); ok && l.claim(c.kind, m.fp, owner, c.asked) {
		return
	}
	f := &l.tx.fetch
	if f.waiting && f.fp == m.fp {
		f.waiting, f.replay, f.resume, f.noFetch = false, true, true, m.fp
	}
}

// serveWants answers the other pairs' requests, after this pair's own TX
// work: the flow is given away, or "none" is said. A request for a flow
// this pair is fetching itself waits until that fetch ends.
func (l *loop) serveWants() {
	ps := l.ps
	// Frames of the flow this pair sent reach the guest before any its
	// new owner sends, and so does their interrupt: the new owner signals
	// its own ring at once.
	l.out.Publish()
	if l.stream == nil && len(ps.wants) > 0 {
		virtqueue.SignalPending(l.qp.RX, l.qp.TX)
	}
	keep := ps.wants[:0]
	for _, w := range ps.wants {
		if ps.claimIndex(w.fp) >= 0 {
			keep = append(keep, w)
			continue
		}
		l.handOff(w)
	}
	clear(ps.wants[len(keep):])
	ps.wants = keep
}

// handOff answers one request.
func (l *loop) handOff(w moveMsg) {
	var (
		state []byte
		fd    int
		ok    bool
	)
	switch w.kind {
	case moveTCP:
		state, fd, ok = l.tcp.HandOff(l.now, w.fp)
	case moveDgram:
		state, fd, ok = l.flows.HandOff(l.now, w.fp, l.ps.dgramState[:0])
	}
	me := l.qp.Index
	if !ok {
		l.s.post(w.from, moveMsg{op: moveNone, kind: w.kind, from: me, fp: w.fp})
		return
	}
	give := moveMsg{op: moveGive, kind: w.kind, from: me, fp: w.fp, state: state, fd: fd}
	if w.kind == moveDgram {
		copy(give.dgram[:], state)
		give.state = nil
	}
	if !l.s.post(w.from, give) {
		// The asking pair's mailbox is full: the flow stays here.
		l.ps.importFlow(l.now, give, l.log)
	}
}

// expireFetches gives up a frame's wait, and fetches nobody answered.
func (l *loop) expireFetches() {
	f := &l.tx.fetch
	if f.waiting && !l.now.Before(f.until) {
		f.waiting, f.drop, f.resume = false, true, true
	}
	ps := l.ps
	for i := 0; i < len(ps.claims); {
		if l.now.Sub(ps.claims[i].since) >= claimWait {
			ps.unclaim(ps.claims[i].fp)
			continue
		}
		i++
	}
}

// fetchDeadline is when expireFetches has work, zero for never.
func (l *loop) fetchDeadline() time.Time {
	var d time.Time
	if l.tx.fetch.waiting {
		d = l.tx.fetch.until
	}
	for i := range l.ps.claims {
		if t := l.ps.claims[i].since.Add(claimWait); d.IsZero() || t.Before(d) {
			d = t
		}
	}
	return d
}

// importFlow puts a flow another pair gave into this pair's table; a
// socket the table refuses (it holds the same flow already, or is full) is
// closed, with RST for TCP.
func (ps *pairState) importFlow(now time.Time, m moveMsg, log *slog.Logger) bool {
	var err error
	switch m.kind {
	case moveTCP:
		err = ps.tcp.Import(now, m.state, m.fd)
	case moveDgram:
		ps.dgramState = m.dgram
		err = ps.flows.Import(now, ps.dgramState[:], m.fd)
	}
	if err == nil {
		return true
	}
	log.Warn("flow from another queue pair refused", "err", err)
	if m.kind == moveTCP {
		hostsock.CloseWithReset(m.fd)
	} else {
		unix.Close(m.fd)
	}
	return false
}

// settleMovesLocked finishes the moves in progress while no loop runs
// (s.mu held, every pair stopped): flows on their way are imported where
// they were sent, and fetches and requests are dropped (each pair's next
// loop fetches again for the frames it gave back).
func (s *Stack) settleMovesLocked() {
	now := time.Now()
	for _, ps := range s.pairs {
		ps.tcp.Detach() // its last loop's epoll set is closed; the next registers
		ps.flows.Detach()
		for {
			m, ok := ps.mail.take()
			if !ok {
				break
			}
			if m.op == moveGive {
				ps.importFlow(now, m, s.log)
			}
		}
	}
	for _, ps := range s.pairs {
		for len(ps.claims) > 0 {
			ps.unclaim(ps.claims[0].fp)
		}
		clear(ps.wants)
		ps.wants = ps.wants[:0]
	}
}

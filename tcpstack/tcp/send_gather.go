package tcp

import (
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
)

// Guest data written to a host socket in runs.
//
// Without TSO (DPDK testpmd, a guest with its offloads off) every guest
// frame carries one segment of at most an MTU, and each was written to
// its socket with a sendmsg of its own: testpmd's guest→host stream cost
// about 4 CPU-seconds per GB, against 1.6 the other way. The in-order
// segments of one connection that follow each other in a TX batch are
// now gathered, their payloads left in guest memory, and written with one
// sendmsg: when the batch ends (FlushSends, which the loop calls where it
// flushes its datagrams, before the guest gets the chains back), or as
// soon as a frame that is not the next such segment comes. A frame for
// another connection, or of another kind for this one (a FIN, an RST, a
// SYN, a pure ACK, a retransmission, a gap), writes the run first: only
// the ACK of the run's own next segment is handled with data waiting. The
// ACK for the run is decided once it is written (ackGuestData), as it was
// per segment; a run the socket took only part of is handled as the
// segments were (FlushSends). A loop that stops on a guest-memory fault,
// and every loop that starts, drops what is gathered (DropSends): the
// guest sends it again.
type sendGather struct {
	f    *conn
	gen  uint32 // f's generation: a slot freed and taken again is not f
	bufs [gatherMaxBufs][]byte
	k    int     // pieces in bufs
	n    int     // bytes
	last int     // where the run's last segment starts, in bytes
	tail segment // what a full socket left of a run, for keepOutOfOrder
}

// gatherMaxBufs bounds the payload pieces of a run (one sendmsg's iovecs).
const gatherMaxBufs = 256

// gatherMaxBytes bounds a run: past it, a socket's send buffer would take
// only part, and the rest comes again from the guest.
const gatherMaxBytes = 256 << 10

// gathering reports whether f has a run waiting.
func (t *Table) gathering(f *conn) bool { return t.gather.f == f }

// flushBefore writes the waiting run unless sg is its next segment: data
// only (ACK and PSH), for the same connection.
func (t *Table) flushBefore(now time.Time, f *conn, sg *segment) {
	if t.gather.f == nil {
		return
	}
	if t.gather.f != f || sg.payloadLen == 0 || sg.flags&^(header.TCPFlagACK|header.TCPFlagPSH) != 0 {
		t.FlushSends(now)
	}
}

// gatherData adds sg's payload to f's run and reports true, or reports
// false when sg cannot join one (then nothing changed).
func (t *Table) gatherData(f *conn, sg *segment, frame [][]byte, skip int) bool {
	g := &t.gather
	if f.fd < 0 || f.fillsHole() {
		return false
	}
	if g.f != nil && g.f != f {
		return false
	}
	if sg.seq != f.seqFromGuest+uint32(g.n) || g.n+sg.payloadLen > gatherMaxBytes {
		return false
	}
	// The payload's pieces, in the frame's iovecs: the whole payload, or
	// the segment path judges it (too many pieces for the run, or a frame
	// shorter than its headers say).
	pieces, covered := header.SliceIovecs(g.bufs[g.k:g.k:len(g.bufs)], frame, skip+sg.payloadOff, sg.payloadLen)
	if covered != sg.payloadLen {
		return false
	}
	k := g.k + len(pieces)
	g.f, g.gen, g.k, g.last, g.n = f, f.gen, k, g.n, g.n+sg.payloadLen
	return true
}

// DropSends forgets the gathered run without writing it: its memory may
// not be the guest's buffers any more (a fault stopped the loop), and the
// guest, which has no ACK for it, sends it again. What the guest
// acknowledged is consumed all the same: its ACK was taken.
func (t *Table) DropSends() {
	t.consumeAcked(time.Now())
	clear(t.gather.bufs[:t.gather.k])
	t.gather.f, t.gather.k, t.gather.n = nil, 0, 0
}

// FlushSends writes the waiting run of guest data, if any, to its socket
// and schedules its ACK, and consumes what the batch's ACKs acknowledged
// (consume.go). The loop calls it before the TX chains the data lives in
// go back to the guest.
func (t *Table) FlushSends(now time.Time) {
	defer t.consumeAcked(now)
	g := &t.gather
	f, k, n, last := g.f, g.k, g.n, g.last
	g.f, g.k, g.n = nil, 0, 0
	if f == nil || n == 0 || f.gen != g.gen || f.fd < 0 {
		clear(g.bufs[:k])
		return
	}
	t.gatherWrites++
	w, ok := t.toSocket(now, f, g.bufs[:k], 0, n)
	if ok && w < n {
		// The socket is full. Segment by segment, the segments after the
		// one written short went the gap path: a SACK guest's were kept
		// (outoforder.go) and every guest got duplicate ACKs for its
		// fast retransmit. The run's rest is kept the same way, from the
		// next byte expected, written at EPOLLOUT.
		g.tail = segment{seq: f.seqFromGuest, payloadLen: n - w}
		t.keepOutOfOrder(f, &g.tail, g.bufs[:k], w)
		if w < last {
			t.dupAcksFor(f)
		}
	}
	clear(g.bufs[:k])
	if !ok {
		return
	}
	t.ackGuestData(now, f, w == n, false)
}

// gatherPieces is hostsock.MaxIovecs, checked at compile time to hold a run.
var _ = [hostsock.MaxIovecs - gatherMaxBufs]struct{}{}

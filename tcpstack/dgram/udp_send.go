package dgram

import (
	"errors"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// Guest→host datagrams of a UDP flow are queued as the TX batch hands
// them in and go out together: consecutive datagrams of one flow (a USO
// frame's segments, a burst of one sender's frames) cost one system call
// where each was a sendmsg: one UDP_SEGMENT send (UDP GSO) for a run of
// one size, one sendmmsg for the others. The payload is
// still the guest's memory, which stays ours until the batch's chains are
// published: the loop calls FlushSends before that, and the queue is
// flushed before a datagram of another flow is queued (order within a
// flow is kept; order between flows never meant anything) and before the
// flow's socket may be closed.

// udpSend is the queue of datagrams waiting for sendmmsg, all of one flow.
type udpSend struct {
	batch hostsock.Batch
	flow  int32 // the flow whose datagrams are queued; -1: none
	fd    int
	dns   bool
	lens  [hostsock.MaxBatch]int
	runs  [hostsock.MaxBatch]hostsock.Run // how FlushSends sends them
}

// queueSend queues the datagrams of bytes [off, off+n) of frame, seg bytes
// each (the last one shorter), for flow i.
func (ft *Table) queueSend(i int32, frame [][]byte, off, n, seg int) {
	tx := &ft.tx
	if tx.batch.Len() > 0 && tx.flow != i {
		ft.FlushSends()
	}
	tx.flow, tx.fd, tx.dns = i, ft.flows[i].fd, ft.flows[i].dns
	for {
		if !tx.batch.Room() {
			ft.FlushSends()
			tx.flow, tx.fd, tx.dns = i, ft.flows[i].fd, ft.flows[i].dns
		}
		m := min(seg, n)
		tx.lens[tx.batch.Len()] = m
		tx.batch.Add(frame, off, m, nil)
		off += m
		n -= m
		if n <= 0 {
			return
		}
	}
}

// maxGSOSegments bounds the datagrams of one UDP_SEGMENT send (Linux
// UDP_MAX_SEGMENTS, 64 before 6.9).
const maxGSOSegments = 64

// FlushSends sends the queued datagrams, in order, with one sendmmsg: a
// run of datagrams of one size (the last may be shorter) as one
// UDP_SEGMENT message, the others as a message each. An error costs only
// the datagram it hit (counted as a send error); a run the kernel refuses
// goes again datagram by datagram, so its errors are per datagram too, and
// a size the kernel cannot segment (EINVAL: larger than the route's MTU
// allows; EIO: no checksum offload) is not tried again on the flow. The
// loop calls it before it publishes the TX chains the datagrams point
// into.
func (ft *Table) FlushSends() {
	tx := &ft.tx
	n := tx.batch.Len()
	if n == 0 {
		return
	}
	f := &ft.flows[tx.flow]
	_, maxPay := udpFrameSizes(f.key.v6)
	k := 0
	for from := 0; from < n; k++ {
		to, seg := tx.run(from, maxPay)
		if to-from < 2 || f.gsoRefused(seg) {
			to, seg = from+1, 0
		}
		tx.runs[k] = hostsock.Run{From: from, To: to, Seg: seg}
		from = to
	}
	retried := false
	// A run planned segmented may meet a refusal from earlier in this
	// very flush: it goes datagram by datagram.
	refused := func(run hostsock.Run) bool { return run.Seg > 0 && f.gsoRefused(run.Seg) }
	for o := 0; o < k; {
		if refused(tx.runs[o]) {
			ft.sendEach(tx.runs[o].From, tx.runs[o].To)
			o++
			continue
		}
		end := o + 1
		for end < k && !refused(tx.runs[end]) {
			end++
		}
		r, err := tx.batch.SendRuns(tx.fd, tx.runs[o:end])
		if err == nil && r <= 0 {
			err = unix.EIO // cannot happen; never loop on it
		}
		if err == nil {
			for _, run := range tx.runs[o : o+r] {
				tx.sent(ft.st, run.From, run.To)
			}
			o += r
			retried = false
			continue
		}
		run := tx.runs[o]
		switch {
		case run.Seg > 0:
			switch {
			case errors.Is(err, unix.EIO):
				f.gsoLimit = 1
			case errors.Is(err, unix.EINVAL):
				f.gsoLimit = run.Seg
			}
			ft.sendEach(run.From, run.To)
		case errors.Is(err, unix.ECONNREFUSED) && !retried:
			// An ICMP error for an earlier datagram was queued on the
			// socket; this one was not sent. Try once more.
			retried = true
			continue
		default:
			ft.st.UDPDrop(stats.FromGuest, stats.DropSendError)
		}
		retried = false
		o++
	}
	tx.batch.Reset()
	tx.flow = -1
}

// DropSends forgets the queued datagrams without sending them: their
// payload may not be the guest's buffers any more (a fault on guest memory
// stopped the loop that queued them), and UDP promises no delivery. Each
// is counted as lost with its broken queue.
func (ft *Table) DropSends() {
	for range ft.tx.batch.Len() {
		ft.st.UDPDrop(stats.FromGuest, stats.DropQueueBroken)
	}
	ft.tx.batch.Reset()
	ft.tx.flow = -1
}

// run is the longest run of queued datagrams from from on that one
// UDP_SEGMENT send can carry: of one size seg, the last maybe shorter
// (but not empty), maxPay bytes at most in all.
func (tx *udpSend) run(from, maxPay int) (to, seg int) {
	seg = tx.lens[from]
	total := seg
	for to = from + 1; to < tx.batch.Len() && to-from < maxGSOSegments; to++ {
		m := tx.lens[to]
		if seg == 0 || m == 0 || m > seg || total+m > maxPay || tx.lens[to-1] != seg {
			break
		}
		total += m
	}
	return to, seg
}

// sendEach sends queued datagrams [from, to) with sendmmsg, a message
// each, each error costing only the datagram it hit.
func (ft *Table) sendEach(from, to int) {
	tx := &ft.tx
	retried := false
	for from < to {
		r, err := tx.batch.Send(tx.fd, from, to)
		if err == nil && r <= 0 {
			err = unix.EIO // cannot happen; never loop on it
		}
		if err != nil {
			if errors.Is(err, unix.ECONNREFUSED) && !retried {
				// An ICMP error for an earlier datagram was queued on
				// the socket; this one was not sent. Try once more.
				retried = true
				continue
			}
			retried = false
			ft.st.UDPDrop(stats.FromGuest, stats.DropSendError)
			from++
			continue
		}
		retried = false
		tx.sent(ft.st, from, from+r)
		from += r
	}
}

// sent counts queued datagrams [from, to) as sent.
func (tx *udpSend) sent(st *stats.Queue, from, to int) {
	for _, m := range tx.lens[from:to] {
		st.Proto.UDPDatagrams[stats.FromGuest].Add(1)
		st.Proto.UDPBytes[stats.FromGuest].Add(uint64(m))
		if tx.dns {
			st.Proto.DNSForwardDatagrams.Add(1)
		}
	}
}

// flushSendsOf sends the queued datagrams if they are flow i's, whose
// socket is about to be closed or handed over.
func (ft *Table) flushSendsOf(i int32) {
	if ft.tx.flow == i && ft.tx.batch.Len() > 0 {
		ft.FlushSends()
	}
}

// SyscallCounts is how many system calls the table's UDP flows have made
// to receive and to send datagrams, and how many of the sends were
// UDP_SEGMENT sends (tests and diagnostics: the calls per datagram).
func (ft *Table) SyscallCounts() (recv, send, segmented uint64) {
	return ft.rx.batch.Calls(), ft.tx.batch.Calls(), ft.tx.batch.SegmentedSends()
}

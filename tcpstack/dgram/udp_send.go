package dgram

import (
	"errors"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// Guest→host datagrams of a UDP flow are queued as the TX batch hands
// them in and go out with one sendmmsg per flow run: consecutive
// datagrams of one flow (a USO frame's segments, a burst of one sender's
// frames) cost one system call where each was a sendmsg. The payload is
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

// FlushSends sends the queued datagrams, in order, each error costing only
// its own datagram (counted as a send error). The loop calls it before it
// publishes the TX chains the datagrams point into.
func (ft *Table) FlushSends() {
	tx := &ft.tx
	b := &tx.batch
	st := ft.st
	retried := false
	for from := 0; from < b.Len(); {
		r, err := b.Send(tx.fd, from)
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
			st.UDPDrop(stats.FromGuest, stats.DropSendError)
			from++
			continue
		}
		retried = false
		for _, m := range tx.lens[from : from+r] {
			st.Proto.UDPDatagrams[stats.FromGuest].Add(1)
			st.Proto.UDPBytes[stats.FromGuest].Add(uint64(m))
			if tx.dns {
				st.Proto.DNSForwardDatagrams.Add(1)
			}
		}
		from += r
	}
	b.Reset()
	tx.flow = -1
}

// flushSendsOf sends the queued datagrams if they are flow i's, whose
// socket is about to be closed or handed over.
func (ft *Table) flushSendsOf(i int32) {
	if ft.tx.flow == i && ft.tx.batch.Len() > 0 {
		ft.FlushSends()
	}
}

// SyscallCounts is how many recvmmsg and sendmmsg calls the table's UDP
// flows have made (tests and diagnostics: the calls per datagram).
func (ft *Table) SyscallCounts() (recv, send uint64) {
	return ft.rx.batch.Calls(), ft.tx.batch.Calls()
}

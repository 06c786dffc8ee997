package dgram

import (
	"cmp"
	"errors"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// Host→guest datagrams of a UDP flow are received with recvmmsg, up to
// udpRecvBatch a call, straight into guest RX buffers reserved for them
// before the call: one system call per batch where there were two per
// datagram (a SIOCINQ ioctl for the next datagram's size, then recvmsg).
//
// A datagram's size is known only once it is received. Where a reservation
// is one guest buffer whatever it holds, each datagram gets one; where it
// is made of as many merged buffers as asked for, each is reserved about
// the size of the flow's recent smallest (nextHint). Either way, behind
// every reservation shorter than the largest datagram the kernel gets an
// overflow region of the table's own: a datagram larger than its
// reservation spills its tail there and is not lost. That datagram and the
// ones received behind it are then assembled in their overflow regions,
// their reservations given back, and copied into fresh reservations of
// their real sizes; when the guest has no buffers for them yet, they wait
// there (pending) for its refill and go first on the next turn, before any
// flow's socket is read again.

const (
	// udpRecvBatch bounds the datagrams of one recvmmsg: past ~16 the
	// call's fixed cost is already a small share.
	udpRecvBatch = 16
	// overflowSize holds the largest datagram (65527 bytes over IPv6), or
	// what UDP_GRO coalesced (at most 64 KiB).
	overflowSize = 65536
	// maxGROSegments bounds the datagrams one receive hands over: GRO
	// coalesces at most 64 from the network (UDP_GRO_CNT_MAX), but a
	// local sender's UDP_SEGMENT send reaches a UDP_GRO socket whole, up
	// to UDP_MAX_SEGMENTS (128 since Linux 6.9, 64 before).
	maxGROSegments = 128
	// udpHintMTU makes the smallest reservation a batch makes per
	// datagram (udpHintFloor): an Ethernet MTU's worth of payload, which
	// fits one buffer of a Linux guest's (at least 1536 bytes with merged
	// buffers), so that datagrams up to that size never spill because a
	// tiny one came first.
	udpHintMTU = 1500
)

// udpRecv is the state of the batch receive, one per table.
type udpRecv struct {
	batch hostsock.Batch
	// hdr and plen are datagram j's reserved header buffer and payload
	// length; its payload buffers are iov[iovAt[j]:iovAt[j+1]].
	hdr   [udpRecvBatch][]byte
	plen  [udpRecvBatch]int
	iovAt [udpRecvBatch + 1]int
	iov   [2 * hostsock.MaxIovecs][]byte
	// overflow holds udpRecvBatch regions of overflowSize, allocated at
	// the first batch receive: every reservation is shorter than the largest
	// datagram or a GRO run, so each receive names its region as the tail
	// (1 MiB per queue pair that receives UDP).
	overflow []byte
	// Pending datagrams of flow pFlow (generation pGen): pending[pNext:pEnd],
	// in the overflow regions.
	pFlow       int32
	pGen        uint32
	pNext, pEnd int
	pending     [udpRecvBatch * maxGROSegments]pendingDatagram
	// lost counts datagrams that found the pending list full (a kernel
	// that hands over more than maxGROSegments at once), to be counted
	// as drops.
	lost int
	// coalesced counts the receives UDP_GRO had coalesced, inPlace those
	// of them that went to the guest as USO frames where they were
	// received.
	coalesced, inPlace uint64
}

// pendingDatagram is a datagram at off in overflow region reg, n bytes
// long; n < 0: one to drop. With seg > 0 it is a run of datagrams of seg
// bytes (the last maybe shorter) for one USO frame (usoRun), which split
// turns back into single datagrams when the guest cannot take the frame.
type pendingDatagram struct {
	reg uint8
	// split: the run goes datagram by datagram.
	split  bool
	off, n int32
	seg    int32
}

// maxGuestUSOSegments bounds the datagrams of one USO frame to the guest:
// a Linux guest refuses a GSO frame of more than UDP_MAX_SEGMENTS (64
// before 6.9) segments (virtio_net_hdr_to_skb).
const maxGuestUSOSegments = 64

// usoRun is how many bytes of datagrams of seg bytes one USO frame to the
// guest carries over IPv6 (v6) or IPv4: at most maxGuestUSOSegments of
// them, within an IP packet's length; 0 when not even two fit (or seg is
// not a size).
func usoRun(seg int, v6 bool) int {
	if seg <= 0 {
		return 0
	}
	_, maxPay := udpFrameSizes(v6)
	k := min(maxGuestUSOSegments, maxPay/seg)
	if k < 2 {
		return 0
	}
	return k * seg
}

// region is overflow region j.
func (rx *udpRecv) region(j int) []byte {
	if rx.overflow == nil {
		rx.overflow = make([]byte, udpRecvBatch*overflowSize)
	}
	return rx.overflow[j*overflowSize : (j+1)*overflowSize]
}

// udpHintFloor is the smallest reservation a batch makes per datagram of
// an IPv6 (v6) or IPv4 flow.
func udpHintFloor(v6 bool) int {
	if v6 {
		return udpHintMTU - header.IPv6MinimumSize - udpHdrLen
	}
	return udpHintMTU - header.IPv4MinimumSize - udpHdrLen
}

// udpFrameSizes are the header length of a UDP frame to the guest and the
// largest payload it can carry.
func udpFrameSizes(v6 bool) (hdrLen, maxPay int) {
	if v6 {
		return header.EthernetMinimumSize + header.IPv6MinimumSize + udpHdrLen, maxUDPv6Pay
	}
	return header.EthernetMinimumSize + header.IPv4MinimumSize + udpHdrLen, maxUDPv4Pay
}

// readUDP moves datagrams from flow i's socket into guest RX buffers.
func (ft *Table) readUDP(w guestring.Sink, i int32) flowRead {
	f := &ft.flows[i]
	if !w.Enabled() {
		ft.dropPending(stats.DropRingDisabled)
		return ft.discardAll(f.fd, true)
	}
	if ft.deliverPending(w) {
		return flowBlocked
	}
	for got := 0; got < flowBudget; {
		r, n := ft.recvBatch(w, i, min(udpRecvBatch, flowBudget-got))
		if r != flowBudgetUsed {
			return r
		}
		got += n
	}
	return flowBudgetUsed
}

// recvBatch reserves guest buffers for up to max datagrams of flow i,
// receives them with one recvmmsg and commits them. It returns
// flowBudgetUsed and how many datagrams it took when the flow may have
// more, else the flow's outcome.
func (ft *Table) recvBatch(w guestring.Sink, i int32, max int) (flowRead, int) {
	f := &ft.flows[i]
	rx := &ft.rx
	hl, maxPay := udpFrameSizes(f.key.v6)
	uso := ft.usoTo(f.key.v6)
	want := maxPay // a buffer each, whatever it holds
	hinted := want // what the flow's hint asks (nextHint learns from it)
	if w.Merging() {
		want = min(cmp.Or(f.hint, udpHintFloor(f.key.v6)), maxPay)
		hinted = want
		if run := usoRun(f.groSeg, f.key.v6); uso && run > 0 {
			// Runs keep coming coalesced: receive the next into a
			// reservation of a whole USO frame, which it then leaves
			// in place, and alone, so that a short one gives back the
			// buffers it did not need rather than wasting them.
			want, max = run, 1
		}
	}
	b := &rx.batch
	b.Reset()
	niov := 0
	for j := 0; j < max && b.Room(); j++ {
		hdr, pay, s := w.Reserve(hl, want)
		if s != guestring.OK {
			if j > 0 {
				break // receive what has buffers
			}
			if s == guestring.NoFit || s == guestring.Broken {
				// The guest can never take it: read it into the discard buffer.
				if ft.discardOne(f.fd, unfit(s)) == flowDrained {
					return flowDrained, 0
				}
				return flowBudgetUsed, 1
			}
			return flowBlocked, 0
		}
		plen := iovLen(pay)
		var extra []byte
		if plen < overflowSize {
			extra = rx.region(j)[:overflowSize-plen] // the largest datagram, or what GRO coalesced
		}
		rx.hdr[j], rx.plen[j] = hdr, b.Add(pay, 0, plen, extra)
		rx.iovAt[j] = niov
		niov += copy(rx.iov[niov:], pay)
		rx.iovAt[j+1] = niov
	}
	k := b.Len()
	m, err := b.Recv(f.fd)
	if err != nil || m == 0 {
		w.Abort()
		switch {
		case err == nil || errors.Is(err, unix.EAGAIN):
			return flowDrained, 0
		case errors.Is(err, unix.ECONNREFUSED), errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.ENETUNREACH):
			return flowBudgetUsed, 1 // an ICMP error reported on the socket; data may follow
		}
		ft.warn("UDP flow receive failed, flow closed", "err", err)
		ft.closeFlow(i)
		return flowDrained, 0
	}
	ft.touch(i)
	f.hint = nextHint(b, m, hinted, udpHintFloor(f.key.v6))
	f.groSeg = lastRun(b, m)
	for j := range m {
		n, mflags := b.Received(j)
		seg := b.Segment(j)
		if uso && seg > 0 && seg < n && n <= rx.plen[j] && mflags&unix.MSG_TRUNC == 0 && n <= usoRun(seg, f.key.v6) {
			// A coalesced run that fits its reservation goes as it lies.
			rx.coalesced++
			rx.inPlace++
			ft.commitRun(w, rx.hdr[j], &f.key, rx.iov[rx.iovAt[j]:rx.iovAt[j+1]], n, seg)
			continue
		}
		if n > rx.plen[j] || mflags&unix.MSG_TRUNC != 0 || (seg > 0 && seg < n) {
			if ft.spill(w, i, j, m) {
				return flowBlocked, m
			}
			break
		}
		ft.commitDatagram(w, rx.hdr[j], &f.key, rx.iov[rx.iovAt[j]:rx.iovAt[j+1]], n)
	}
	if m < k {
		// The reservations of datagrams that were not there. The socket
		// is not known to be drained: recvmmsg also stops short at an
		// error (an ICMP error reported on the socket, which the next
		// call returns), with datagrams still queued behind it, and
		// epoll is edge-triggered. The next call tells.
		w.Abort()
	}
	return flowBudgetUsed, m
}

// lastRun is the segment size of the last of the m datagrams of b that
// UDP_GRO coalesced, 0 when none was.
func lastRun(b *hostsock.Batch, m int) int {
	for j := m - 1; j >= 0; j-- {
		if n, _ := b.Received(j); b.Segment(j) > 0 && b.Segment(j) < n {
			return b.Segment(j)
		}
	}
	return 0
}

// nextHint is what the next batch of a flow reserves per datagram with
// merged guest buffers, after one that received m datagrams with want
// each. Erring small costs a copy for a larger datagram (it spills);
// erring large costs guest buffers (see guestring.Sink.Merging): the
// driver counts a length error for each one that comes back empty. So
// the hint drops at once to the smallest datagram received (not below
// floor), and rises to it only after a batch of at least half of
// udpRecvBatch datagrams that were all larger.
func nextHint(b *hostsock.Batch, m, want, floor int) int {
	least := -1
	for j := range m {
		n, mflags := b.Received(j)
		if seg := b.Segment(j); seg > 0 && seg < n {
			n = seg // coalesced: datagrams of seg bytes
		}
		if mflags&unix.MSG_TRUNC == 0 && (least < 0 || n < least) {
			least = n
		}
	}
	switch {
	case least < 0:
		return want
	case least < want:
		return max(least, floor)
	case m >= udpRecvBatch/2:
		return least
	}
	return want
}

// spill handles datagrams [j, m) of the last batch of flow i, the first of
// which did not fit its reservation or was several coalesced (UDP_GRO):
// it assembles each in its overflow region, gives the reservations back
// and delivers them from there, coalesced ones cut into their datagrams.
// It reports whether some are left pending (the guest's buffers ran out).
func (ft *Table) spill(w guestring.Sink, i int32, j, m int) (blocked bool) {
	rx := &ft.rx
	rx.pNext, rx.pEnd = 0, 0
	for x := j; x < m; x++ {
		n, mflags := rx.batch.Received(x)
		if mflags&unix.MSG_TRUNC != 0 {
			rx.pend(x, 0, -1, 0)
			continue
		}
		reg := rx.region(x)
		g := min(n, rx.plen[x])
		copy(reg[g:n], reg[:n-g]) // the tail, behind where the head goes
		header.CopyFromIovecs(reg[:g], rx.iov[rx.iovAt[x]:rx.iovAt[x+1]], 0)
		seg := rx.batch.Segment(x)
		if seg <= 0 || seg >= n {
			rx.pend(x, 0, n, 0)
			continue
		}
		rx.coalesced++
		// A guest that takes USO frames gets the run as few frames (the
		// kernel coalesced it, the guest's cuts it up again as late as it
		// can); any other, a frame per datagram.
		step, each := seg, 0
		if v6 := ft.flows[i].key.v6; ft.usoTo(v6) {
			if run := usoRun(seg, v6); run > 0 {
				step, each = run, seg
			}
		}
		for off := 0; off < n; off += step {
			rx.pend(x, off, min(step, n-off), each)
		}
	}
	w.Abort()
	for ; rx.lost > 0; rx.lost-- {
		ft.st.UDPDrop(stats.ToGuest, stats.DropPendingOverflow)
	}
	rx.pFlow, rx.pGen = i, ft.flows[i].gen
	return ft.deliverPending(w)
}

// pend adds a pending datagram of n bytes at off in region x (n < 0: one
// to drop), or with seg > 0 a run of them for a USO frame; past the list's
// room (more than a receive hands over) it is lost, and counted as a drop
// by the caller.
func (rx *udpRecv) pend(x, off, n, seg int) {
	if rx.pEnd == len(rx.pending) {
		rx.lost++
		return
	}
	rx.pending[rx.pEnd] = pendingDatagram{reg: uint8(x), off: int32(off), n: int32(n), seg: int32(seg)}
	rx.pEnd++
}

// deliverPending copies pending datagrams into guest buffers of their
// size. It reports whether some are still pending (the guest's buffers ran
// out: the caller waits for the refill).
func (ft *Table) deliverPending(w guestring.Sink) (blocked bool) {
	rx := &ft.rx
	if rx.pNext >= rx.pEnd {
		return false
	}
	f := &ft.flows[rx.pFlow]
	if !f.inUse || f.gen != rx.pGen || f.key.kind != flowUDP {
		ft.dropPending(stats.DropFlowClosed) // the flow was closed meanwhile
		return false
	}
	hl, _ := udpFrameSizes(f.key.v6)
	for ; rx.pNext < rx.pEnd; rx.pNext++ {
		if ft.deliverOne(w, &rx.pending[rx.pNext], hl, &f.key) {
			return true
		}
	}
	return false
}

// deliverOne copies pending datagram d into guest buffers, or a USO run
// into one frame, and reports whether the guest's buffers ran out first.
// A run that no guest buffer can ever hold goes datagram by datagram: d
// then shrinks by each one delivered, so that a refill resumes behind it.
func (ft *Table) deliverOne(w guestring.Sink, d *pendingDatagram, hl int, key *flowKey) (blocked bool) {
	if d.n < 0 {
		ft.st.UDPDrop(stats.ToGuest, stats.DropNoFit)
		return false
	}
	for {
		n, seg := int(d.n), int(d.seg)
		run := seg > 0 && n > seg && !d.split
		if seg > 0 && !run {
			n = min(n, seg)
		}
		hdr, pay, s := w.Reserve(hl, n)
		if s == guestring.OK && iovLen(pay) < n {
			w.Abort()
			if w.MoreLater() {
				return true
			}
			// That is all the guest's ring can ever give: a run goes
			// datagram by datagram rather than wait for ever, with the
			// flows behind it.
			s = guestring.NoFit
		}
		switch s {
		case guestring.OK:
			header.WriteIovecs(pay, 0, ft.rx.region(int(d.reg))[d.off:int(d.off)+n])
			ft.commitRun(w, hdr, key, pay, n, seg)
		case guestring.NoFit, guestring.Broken:
			if run && s == guestring.NoFit {
				d.split = true // the guest cannot take the run whole
				continue
			}
			ft.st.UDPDropN(stats.ToGuest, unfit(s), segments(n, seg))
		default:
			return true
		}
		d.off, d.n = d.off+int32(n), d.n-int32(n)
		if d.n <= 0 {
			return false
		}
	}
}

// dropPending drops the pending datagrams, counted as why (a datagram that
// was truncated, and would have been dropped anyway, as DropNoFit).
func (ft *Table) dropPending(why stats.DropReason) {
	rx := &ft.rx
	for ; rx.pNext < rx.pEnd; rx.pNext++ {
		d := &rx.pending[rx.pNext]
		if d.n < 0 {
			ft.st.UDPDrop(stats.ToGuest, stats.DropNoFit)
			continue
		}
		ft.st.UDPDropN(stats.ToGuest, why, segments(int(d.n), int(d.seg)))
	}
}

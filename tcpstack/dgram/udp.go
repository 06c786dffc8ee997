package dgram

import (
	"encoding/binary"
	"net/netip"
	"time"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// UDP flows: a guest datagram to remote:port goes out of a host UDP socket
// connected to remote:port (one socket per guest 4-tuple, so replies find
// their way back by the kernel's own demultiplexing); datagrams arriving on
// that socket are received straight into the guest's RX buffers, behind
// headers built in place.

const (
	udpHdrLen   = header.UDPMinimumSize
	maxUDPv4Pay = 65535 - header.IPv4MinimumSize - udpHdrLen
	maxUDPv6Pay = 65535 - udpHdrLen
	// maxUSOSegments bounds the datagrams one USO frame may carry (Linux
	// sends at most 64 per GSO skb, UDP_MAX_SEGMENTS).
	maxUSOSegments = 128
	// udpRcvBuf is the SO_RCVBUF a UDP flow's socket asks for, as QUIC
	// stacks ask for theirs (quic-go: 7 MiB); the kernel grants at most
	// net.core.rmem_max.
	udpRcvBuf = 4 << 20
)

// UDP sends a guest UDP datagram (p, parsed from the frame at offset skip
// of the iovecs frame, guest memory) from its flow's socket, payload
// straight from guest memory. vh is the frame's virtio-net header: with
// USO (GSO_UDP_L4) the frame carries several datagrams of GSOSize.
func (ft *Table) UDP(now time.Time, p *header.Packet, frame [][]byte, skip int, vh *virtqueue.NetHdr) {
	ft.now = now
	st := ft.st
	if len(p.L4) < udpHdrLen {
		st.UDPDrop(stats.FromGuest, stats.DropMalformed)
		return
	}
	u := p.L4
	ulen := int(binary.BigEndian.Uint16(u[4:6]))
	if ulen < udpHdrLen || ulen > p.L4Len {
		// Length 0 over IPv6 would be a jumbogram's, which no link of
		// ours carries: malformed like any other short length.
		st.UDPDrop(stats.FromGuest, stats.DropMalformed)
		return
	}
	key := packetKey(flowUDP, p, binary.BigEndian.Uint16(u[0:2]), binary.BigEndian.Uint16(u[2:4]))
	if key.remotePort == 0 {
		st.UDPDrop(stats.FromGuest, stats.DropMalformed)
		return
	}
	i, why, ok := ft.lookup(&key)
	if !ok {
		if why != dropTaken {
			st.Proto.UDPDrops[stats.FromGuest][why].Add(1) // lookup counted the TX drop
		}
		return
	}
	off := skip + p.L4Off + udpHdrLen
	n := ulen - udpHdrLen
	seg := n
	if vh.GSOKind() == virtqueue.GSOUDPL4 && vh.GSOSize > 0 {
		seg = int(vh.GSOSize)
		if (n+seg-1)/seg > maxUSOSegments {
			// A tiny segment size would turn one frame into thousands of
			// datagrams; no real driver does that.
			st.UDPDrop(stats.FromGuest, stats.DropMalformed)
			return
		}
		if seg < n {
			st.Proto.UDPUSOFrames[stats.FromGuest].Add(1)
		}
	}
	ft.queueSend(i, frame, off, n, seg)
}

// datagramReservation is the outcome of reserveDatagram: one of the
// flowRead outcomes, or reserved (go on and receive), or retry (a
// datagram was discarded, try the next).
type datagramReservation = flowRead

const (
	datagramReserved datagramReservation = iota + flowBlocked + 1
	datagramRetry
)

// reserveDatagram takes guest buffers for the next datagram queued on fd
// (IPv6 headers when v6), for the datagrams of forwarded ports (flows use
// the batch receive). A datagram the guest can never take is received into the discard buffer
// and counted; with the ring disabled, everything queued is (vhost-user:
// frames are not supplied, not queued).
func (ft *Table) reserveDatagram(w guestring.Sink, fd int, v6 bool) (hdr []byte, pay [][]byte, r datagramReservation) {
	if !w.Enabled() {
		return nil, nil, ft.discardAll(fd, true)
	}
	hl, maxPay := header.EthernetMinimumSize+header.IPv4MinimumSize+udpHdrLen, maxUDPv4Pay
	if v6 {
		hl, maxPay = header.EthernetMinimumSize+header.IPv6MinimumSize+udpHdrLen, maxUDPv6Pay
	}
	hdr, pay, s := w.Reserve(hl, maxPay)
	switch s {
	case guestring.OK:
	case guestring.NoFit, guestring.Broken:
		return nil, nil, ft.discardOne(fd, unfit(s)) // the guest can never take it
	default:
		return nil, nil, flowBlocked
	}
	if plen := iovLen(pay); plen < maxPay {
		// Is the next datagram larger than what we hold?
		if size, err := hostsock.NextDatagram(fd); err == nil && size > plen {
			w.Abort()
			if w.MoreLater() {
				return nil, nil, flowBlocked // wait for the guest to post more buffers
			}
			return nil, nil, ft.discardOne(fd, stats.DropNoFit)
		}
	}
	return hdr, pay, datagramReserved
}

// discardOne receives the next datagram on fd (or UDP_GRO run) into the
// discard buffer and counts each datagram it holds as one the guest could
// not take, for why (DropNoFit, or DropQueueBroken for a ring broken under
// it): retry the next, or drained when there was none.
func (ft *Table) discardOne(fd int, why stats.DropReason) datagramReservation {
	if ft.discardUDP(fd, 1, why) == 0 {
		return flowDrained
	}
	return datagramRetry
}

// segments is how many datagrams n bytes of datagrams of seg bytes each
// (the last maybe shorter) are: one unless seg is a segment size below n.
func segments(n, seg int) int {
	if seg <= 0 || n <= seg {
		return 1
	}
	return (n + seg - 1) / seg
}

// unfit is the drop reason of a datagram the guest's ring refused with s
// (guestring.NoFit or guestring.Broken).
func unfit(s guestring.Status) stats.DropReason {
	if s == guestring.Broken {
		return stats.DropQueueBroken
	}
	return stats.DropNoFit
}

// discardAll reads and drops what is queued on fd (RX ring disabled), at
// most flowBudget datagrams a turn like any delivery: a peer that keeps
// sending faster than we discard must not hold the loop in here, away from
// its other flows and from the stop it is asked for. UDP datagrams (udp)
// count in the UDP drops too, each datagram of a coalesced receive; the
// budget counts receives.
func (ft *Table) discardAll(fd int, udp bool) flowRead {
	for got := 0; got < flowBudget; {
		if !udp {
			if _, _, err := ft.io.Recv(fd, ft.discardIO[:], 0); err != nil {
				return flowDrained
			}
			ft.st.RX.Drops[stats.DropRingDisabled].Add(1)
			got++
			continue
		}
		m := ft.discardUDP(fd, min(udpRecvBatch, flowBudget-got), stats.DropRingDisabled)
		if m == 0 {
			return flowDrained
		}
		got += m
	}
	return flowBudgetUsed
}

// discardUDP receives up to max datagrams from fd into the discard buffer
// with one recvmmsg and counts each as a UDP drop for why, a receive that
// UDP_GRO coalesced (a flow's socket has it on; the buffer holds the
// largest run) as the datagrams it holds. It returns how many receives it
// made: 0 when none was queued, or at an error.
func (ft *Table) discardUDP(fd, max int, why stats.DropReason) int {
	b := &ft.rx.batch
	b.Reset()
	for j := 0; j < max && b.Room(); j++ {
		b.Add(ft.discardIO[:], 0, len(ft.discard), nil)
	}
	m, err := b.Recv(fd)
	if err != nil {
		return 0
	}
	for j := range m {
		n, _ := b.Received(j)
		ft.st.UDPDropN(stats.ToGuest, why, segments(n, b.Segment(j)))
	}
	return m
}

// commitDatagram builds the headers of a datagram of n payload bytes
// (received into pay) from key's remote end to the guest and commits it.
func (ft *Table) commitDatagram(w guestring.Sink, hdr []byte, key *flowKey, pay [][]byte, n int) {
	ft.commitRun(w, hdr, key, pay, n, 0)
}

// commitRun commits n bytes of datagrams of seg bytes each (the last maybe
// shorter), already in pay: as one USO frame (usoTo) when they are
// several, else as the one datagram they are (seg 0 or at least n). A USO
// frame's headers are those of one datagram of them all, as Linux builds a
// UDP GSO packet (IP and UDP lengths of the whole, the UDP checksum field
// the pseudo-header sum over that length), which the guest adjusts for
// each datagram it cuts.
func (ft *Table) commitRun(w guestring.Sink, hdr []byte, key *flowKey, pay [][]byte, n, seg int) {
	ft.buildUDPHeaders(hdr, key, pay, n)
	datagrams := segments(n, seg)
	if datagrams > 1 {
		if !key.v6 {
			// The guest numbers the datagrams it cuts from the frame's ID on.
			ft.ipID += uint16(datagrams - 1)
		}
		ft.vh.GSOType = virtqueue.GSOUDPL4
		ft.vh.GSOSize = uint16(seg)
		ft.vh.HdrLen = uint16(len(hdr))
		ft.st.Proto.UDPUSOFrames[stats.ToGuest].Add(1)
	}
	w.Commit(n, &ft.vh)
	ft.st.Proto.UDPDatagrams[stats.ToGuest].Add(uint64(datagrams))
	ft.st.Proto.UDPBytes[stats.ToGuest].Add(uint64(n))
}

// iovLen is the total length of bufs.
func iovLen(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}

func (ft *Table) openUDP(host netip.AddrPort) (int, error) { return ft.openDgram(host, 0) }

package tcpstack

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

const (
	// txBatchMax is how many TX chains are popped before they are all
	// returned with one used-index update.
	txBatchMax = 64
	// txBatchesPerIteration bounds TX work per loop iteration so a guest
	// that never stops sending cannot starve the RX side and the sockets.
	txBatchesPerIteration = 8
	// txHeadLen is how much of each frame is copied out of guest memory
	// for parsing: Ethernet + IPv6 with some extension headers + TCP with
	// options fits. Payload stays in guest memory.
	txHeadLen = 256
	// txFullMax bounds a frame a link service reads whole (DHCP, NDP...).
	txFullMax = 9216
)

// txPath holds the per-loop scratch state of the TX side.
type txPath struct {
	chains   [txBatchMax]virtqueue.Chain
	n, next  int     // chains popped in the open batch; the next one to handle
	pinned   int     // chains[:pinned] were popped before a bad chain: they cannot be given back (leaveRings)
	fetch    txFetch // a frame waiting for its flow from another pair (moves.go)
	hdr      virtqueue.NetHdr
	head     [virtqueue.NetHdrLen + txHeadLen]byte
	full     [txFullMax]byte
	pkt      header.Packet // the frame being dispatched, parsed
	broken   bool
	logLimit stats.Limiter // the per-frame debug line
}

// processTX drains the TX ring in batches with kicks disabled, re-enabling
// them only when the ring is empty (and re-checking after, as the guest may
// have added chains in between). It returns true if work is left over
// because the per-iteration budget ran out.
func (l *loop) processTX() (more bool) {
	if l.stream != nil {
		return l.streamTX()
	}
	q := l.qp.TX
	if l.tx.broken || l.tx.fetch.waiting {
		return false // a frame waits for its flow: its arrival brings us back
	}
	q.DisableKicks()
	for b := 0; ; b++ {
		if b == txBatchesPerIteration {
			return true // kicks stay disabled: the loop comes back without waiting
		}
		full := l.txBatch()
		// Replies produced by this batch go out before the next batch, so a
		// burst of requests does not overflow the pending ring.
		l.deliverPending()
		if l.tx.broken || l.tx.fetch.waiting {
			return false // kicks stay disabled: nothing is taken before the frame that waits
		}
		if full {
			// More frames wait: acknowledge what this batch wrote before
			// taking them, so a sender held by its window (one that can
			// fill the ring, see tcp/ring_budget.go) refills the ring
			// while we work instead of after the whole iteration.
			l.tcpOutput()
			l.out.Publish()
			virtqueue.SignalPending(l.qp.RX, l.qp.TX)
			continue
		}
		if !q.RearmKicks() {
			return false
		}
	}
}

// txBatch pops up to txBatchMax chains, handles each frame, pushes every
// chain back with length 0 and publishes them with one Flush. It reports
// whether the batch was full (more chains may be waiting).
//
// A frame whose flow another pair holds stops the batch (moves.go): its
// chain and the ones after it stay popped, and the next call, once the
// flow came (or the wait gave up), goes on from it.
func (l *loop) txBatch() (full bool) {
	q := l.qp.TX
	if l.tx.next >= l.tx.n {
		n := 0
		l.tx.pinned = 0
		for n < txBatchMax {
			ok, skipped, err := q.PopSkipping(&l.tx.chains[n])
			if skipped > 0 {
				l.tx.pinned = n // leaveRings may not Unpop chains[:n]
			}
			if err != nil {
				l.tx.broken = true
				l.st.TX.Drops[stats.DropQueueBroken].Add(1)
				l.log.Error("TX ring broken: guest frames are ignored until the ring is reset", "err", err)
				break
			}
			if !ok {
				break
			}
			n++
		}
		l.tx.n, l.tx.next = n, 0
	}
	f := &l.tx.fetch
	for l.tx.next < l.tx.n {
		c := &l.tx.chains[l.tx.next]
		switch {
		case f.drop:
			f.drop = false
			l.st.TX.Drops[stats.DropFlowMoving].Add(1)
		case f.replay:
			f.replay = false
			l.dispatchWaiting(c)
			f.noFetch = 0
		default:
			l.handleTXFrame(c)
		}
		if f.waiting {
			break
		}
		q.Push(c.Head, 0)
		l.tx.next++
	}
	// The datagrams queued for sendmmsg, and the TCP data gathered for a
	// socket, point into the chains: they go out before the guest gets
	// the chains back.
	l.flushSends()
	// Pop stages malformed chains as used by itself: a batch of only bad
	// chains (n == 0) must be published too, or the guest never gets those
	// descriptors back.
	if q.Staged() > 0 {
		l.st.TX.Batches.Add(1) // before Flush: counters never lag the ring
		q.Flush()
	}
	if f.waiting {
		return false
	}
	return l.tx.n == txBatchMax
}

// handleTXFrame parses one guest frame from a private copy of its headers
// and dispatches it.
func (l *loop) handleTXFrame(c *virtqueue.Chain) {
	st := l.st
	total := c.ReadableLen()
	st.TX.Frames.Add(1)
	if !l.qp.TXEnabled {
		st.TX.Drops[stats.DropRingDisabled].Add(1)
		return
	}
	hl := l.vhLen
	if total < hl+header.EthernetMinimumSize {
		st.TX.Drops[stats.DropRunt].Add(1)
		return
	}
	frameLen := total - hl
	st.TX.Bytes.Add(uint64(frameLen))
	if cp := l.s.cfg.Capture; cp != nil {
		cp.Frame(l.qp.Index, c.Readable, hl, frameLen)
	}
	n := header.CopyFromIovecs(l.tx.head[:hl+min(frameLen, txHeadLen)], c.Readable, 0)
	if hl > 0 {
		_ = l.tx.hdr.Decode(l.tx.head[:hl])
	} else {
		l.tx.hdr = virtqueue.NetHdr{} // a stream carries no offloads
	}
	head := l.tx.head[hl:n]

	if src := head[6:12]; src[0]&1 == 0 {
		l.learnGuestMAC(src)
	}
	p := &l.tx.pkt
	err := header.ParseFrame(head, frameLen, p)
	switch p.EtherType {
	case header.EtherTypeARP:
		st.TXByEtherType[stats.EtherARP].Add(1)
		l.serve(stats.SvcARP, p, head)
	case header.EtherTypeIPv4, header.EtherTypeIPv6:
		if p.EtherType == header.EtherTypeIPv4 {
			st.TXByEtherType[stats.EtherIPv4].Add(1)
		} else {
			st.TXByEtherType[stats.EtherIPv6].Add(1)
		}
		if err != nil {
			st.TX.Drops[stats.DropMalformed].Add(1)
			return
		}
		// A frame of its own chain may wait for its flow to come from
		// another pair (moves.go); a reassembled datagram cannot.
		l.tx.fetch.fetchable = l.stream == nil // a stream is one pair: no other holds a flow
		l.dispatchIP(c, p)
		l.tx.fetch.fetchable = false
	default:
		st.TXByEtherType[stats.EtherOther].Add(1)
		st.TX.Drops[stats.DropUnknownEtherType].Add(1)
		l.logUnknown("unknown ethertype", p)
	}
}

// fullFrame returns the whole frame copied out of the chain, or nil (counted)
// when it is larger than a link service may ask for.
func (l *loop) fullFrame(c *virtqueue.Chain, p *header.Packet) []byte {
	if p.Len <= len(p.Frame) {
		return p.Frame
	}
	if p.Len > len(l.tx.full) {
		l.st.TX.Drops[stats.DropOversize].Add(1)
		return nil
	}
	n := header.CopyFromIovecs(l.tx.full[:p.Len], c.Readable, l.vhLen)
	return l.tx.full[:n]
}

// flushSends writes what the frames handled so far left waiting in guest
// memory: datagrams for sendmmsg (dgram) and runs of TCP data
// (tcp/send_gather.go). Their buffers must not go back to the guest, or be
// reused, before.
func (l *loop) flushSends() {
	l.flows.FlushSends()
	l.tcp.FlushSends(l.now)
}

// dispatchIP hands an IPv4 or IPv6 packet to whoever translates it:
// reassembly for a fragment, a link service for DHCP, DHCPv6 and NDP, the
// TCP table or the datagram flows.
func (l *loop) dispatchIP(c *virtqueue.Chain, p *header.Packet) {
	v6 := p.IsIPv6()
	if p.Fragment {
		l.tx.fetch.fetchable = false
		l.reassemble(c, p)
		return
	}
	_, dport, ports := p.Ports()
	var svc stats.Service
	switch {
	case !v6 && p.Protocol == header.IPProtocolUDP && ports && dport == header.DHCPv4ServerPort:
		svc = stats.SvcDHCP
	case v6 && p.Protocol == header.IPProtocolUDP && ports && dport == header.DHCPv6ServerPort:
		svc = stats.SvcDHCPv6
	case v6 && p.Protocol == header.IPProtocolICMPv6 && len(p.L4) >= 1 && p.L4[0] >= 133 && p.L4[0] <= 137:
		svc = stats.SvcNDP // RS, RA, NS, NA, redirect
	default:
		l.dispatchFlow(c, p)
		return
	}
	if f := l.fullFrame(c, p); f != nil {
		l.serve(svc, p, f)
	}
}

// dispatchFlow hands a packet to the TCP table or the datagram flows, or
// counts it untranslated.
func (l *loop) dispatchFlow(c *virtqueue.Chain, p *header.Packet) {
	icmp := header.IPProtocolICMPv4
	if p.IsIPv6() {
		icmp = header.IPProtocolICMPv6
	}
	switch p.Protocol {
	case header.IPProtocolTCP, header.IPProtocolUDP, icmp:
	default:
		l.untranslated(p)
		return
	}
	if l.protocolDisabled(p.Protocol) {
		return
	}
	switch p.Protocol {
	case header.IPProtocolTCP:
		if l.s.noHostSockets {
			return
		}
		if !l.tcp.HandleGuestFrame(l.now, p, c.Readable, l.vhLen) {
			l.st.TX.Drops[stats.DropMalformed].Add(1)
		}
	case header.IPProtocolUDP:
		l.flows.UDP(l.now, p, c.Readable, l.vhLen, &l.tx.hdr)
	default:
		if !l.flows.ICMP(l.now, p, c.Readable, l.vhLen) {
			l.untranslated(p)
		}
	}
}

// dispatchWaiting hands in again the frame that waited for its flow: its
// parse, l.tx.pkt, and its virtio-net header, l.tx.hdr, are as the wait
// left them (no other frame was handled since).
func (l *loop) dispatchWaiting(c *virtqueue.Chain) {
	l.tx.fetch.fetchable = l.stream == nil
	l.dispatchFlow(c, &l.tx.pkt)
	l.tx.fetch.fetchable = false
}

// untranslated counts (and maybe logs) an IP packet nothing translates.
func (l *loop) untranslated(p *header.Packet) {
	l.st.TX.Drops[stats.DropUnhandledProtocol].Add(1)
	if p.IsIPv6() {
		l.logUnknown("untranslated IPv6", p)
	} else {
		l.logUnknown("untranslated IPv4", p)
	}
}

// protocolDisabled reports (and counts) a guest packet of a protocol the
// configuration turns off (passt's --no-tcp, --no-udp, --no-icmp).
func (l *loop) protocolDisabled(proto header.IPProtocol) bool {
	cfg := &l.s.cfg
	var off bool
	switch proto {
	case header.IPProtocolTCP:
		off = cfg.NoTCP
	case header.IPProtocolUDP:
		off = cfg.NoUDP
	case header.IPProtocolICMPv4, header.IPProtocolICMPv6:
		off = cfg.NoICMP
	}
	if off {
		l.st.TX.Drops[stats.DropProtocolDisabled].Add(1)
	}
	return off
}

// serve lets link service svc answer frame (p's whole frame); a reply is
// queued for the guest and counted by what the service says it built.
func (l *loop) serve(svc stats.Service, p *header.Packet, frame []byte) {
	var answer func(*header.Packet, []byte, []byte) (int, linksvc.Reply)
	switch svc {
	case stats.SvcARP:
		answer = l.link.ARP
	case stats.SvcDHCP:
		answer = l.link.DHCP
	case stats.SvcDHCPv6:
		answer = l.link.DHCPv6
	case stats.SvcNDP:
		answer = l.link.NDP
	default:
		l.st.TX.Drops[stats.DropUnhandledProtocol].Add(1)
		return
	}
	n, kind := answer(p, frame, l.pending.next())
	if n <= 0 {
		l.st.TX.Drops[stats.DropUnanswered].Add(1)
		return
	}
	l.st.ServiceReplies[svc].Add(1)
	countServiceReply(l.st, svc, kind)
	l.queueReply(n)
}

// countServiceReply counts a link-service reply by what the service says
// it built.
func countServiceReply(st *stats.Queue, svc stats.Service, r linksvc.Reply) {
	switch {
	case svc == stats.SvcDHCP && r == linksvc.ReplyLease:
		st.Proto.DHCPLeases.Add(1)
	case svc == stats.SvcDHCPv6 && r == linksvc.ReplyLease:
		st.Proto.DHCPv6Leases.Add(1)
	case r == linksvc.ReplyRouterAdvert:
		st.Proto.RouterAdverts.Add(1)
	case r == linksvc.ReplyNeighborAdvert:
		st.Proto.NeighborAdverts.Add(1)
	}
}

// learnGuestMAC remembers the guest's unicast source address, so frames we
// originate (socket data) are addressed to it.
func (l *loop) learnGuestMAC(src []byte) {
	mac := [6]byte(src)
	v := macToU64(mac)
	if v != 0 && l.s.guestMAC.Load() != v {
		l.s.guestMAC.Store(v)
	}
	// Forwarded host connections need the MAC too, and a guest that only
	// listens never sends the TCP segment the table would learn it from.
	if v != 0 && l.tcp != nil {
		l.tcp.SetGuest(mac, netip.Addr{}, netip.Addr{})
	}
}

// logUnknown logs a frame the stack dropped, at most once per second per
// pair, and only when debug logging is on (building the line allocates).
func (l *loop) logUnknown(what string, p *header.Packet) {
	if !l.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	if ok, _ := l.tx.logLimit.Allow(time.Now(), time.Second); !ok {
		return
	}
	l.log.Debug("frame dropped", "why", what, "pair", l.qp.Index,
		"ethertype", uint16(p.EtherType), "proto", int(p.Protocol), "dst", fmtMAC([6]byte(p.Frame[0:6])),
		"src", fmtMAC([6]byte(p.Frame[6:12])))
}

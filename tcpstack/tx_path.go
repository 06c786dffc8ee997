package tcpstack

import (
	"context"
	"encoding/binary"
	"log/slog"
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

const (
	etherTypeIPv4 = 0x0800
	etherTypeARP  = 0x0806
	etherTypeIPv6 = 0x86dd
	ethHdrLen     = 14

	ipProtoICMP   = 1
	ipProtoTCP    = 6
	ipProtoUDP    = 17
	ipProtoICMPv6 = 58
)

// txPath holds the per-loop scratch state of the TX side.
type txPath struct {
	chains   [txBatchMax]virtqueue.Chain
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
	q := l.qp.TX
	if l.tx.broken {
		return false
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
		if l.tx.broken {
			return false
		}
		if full {
			continue
		}
		if !q.EnableKicks() {
			return false
		}
	}
}

// txBatch pops up to txBatchMax chains, handles each frame, pushes every
// chain back with length 0 and publishes them with one Flush. It reports
// whether the batch was full (more chains may be waiting).
func (l *loop) txBatch() (full bool) {
	q := l.qp.TX
	n := 0
	for n < txBatchMax {
		ok, err := q.Pop(&l.tx.chains[n])
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
	for i := 0; i < n; i++ {
		c := &l.tx.chains[i]
		l.handleTXFrame(c)
		q.Push(c.Head, 0)
	}
	// Pop stages malformed chains as used by itself: a batch of only bad
	// chains (n == 0) must be published too, or the guest never gets those
	// descriptors back.
	if q.Staged() > 0 {
		l.st.TX.Batches.Add(1) // before Flush: counters never lag the ring
		q.Flush()
	}
	return n == txBatchMax
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
	if total < hl+ethHdrLen {
		st.TX.Drops[stats.DropRunt].Add(1)
		return
	}
	frameLen := total - hl
	st.TX.Bytes.Add(uint64(frameLen))
	if cp := l.s.cfg.Capture; cp != nil {
		cp.Frame(l.qp.Index, c.Readable, hl, frameLen)
	}
	n := header.CopyFromIovecs(l.tx.head[:hl+min(frameLen, txHeadLen)], c.Readable, 0)
	_ = l.tx.hdr.Decode(l.tx.head[:hl])
	head := l.tx.head[hl:n]

	if src := head[6:12]; src[0]&1 == 0 {
		l.learnGuestMAC(src)
	}
	switch binary.BigEndian.Uint16(head[12:14]) {
	case etherTypeARP:
		st.TXByEtherType[stats.EtherARP].Add(1)
		l.serve(stats.SvcARP, head)
	case etherTypeIPv4:
		st.TXByEtherType[stats.EtherIPv4].Add(1)
		l.handleIPv4(c, head, frameLen)
	case etherTypeIPv6:
		st.TXByEtherType[stats.EtherIPv6].Add(1)
		l.handleIPv6(c, head, frameLen)
	default:
		st.TXByEtherType[stats.EtherOther].Add(1)
		st.TX.Drops[stats.DropUnknownEtherType].Add(1)
		l.logUnknown("unknown ethertype", head)
	}
}

// fullFrame returns the whole frame copied out of the chain, or nil (counted)
// when it is larger than a link service may ask for.
func (l *loop) fullFrame(c *virtqueue.Chain, head []byte, frameLen int) []byte {
	if frameLen <= len(head) {
		return head
	}
	if frameLen > len(l.tx.full) {
		l.st.TX.Drops[stats.DropOversize].Add(1)
		return nil
	}
	n := header.CopyFromIovecs(l.tx.full[:frameLen], c.Readable, l.vhLen)
	return l.tx.full[:n]
}

// handleIPv4 dispatches an IPv4 frame. head is the copied start of the frame.
func (l *loop) handleIPv4(c *virtqueue.Chain, head []byte, frameLen int) {
	ip := head[ethHdrLen:]
	if len(ip) < 20 || ip[0]>>4 != 4 {
		l.st.TX.Drops[stats.DropMalformed].Add(1)
		return
	}
	ihl := int(ip[0]&0xf) * 4
	if ihl < 20 || len(ip) < ihl {
		l.st.TX.Drops[stats.DropMalformed].Add(1)
		return
	}
	proto := ip[9]
	fragmented := binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0
	if fragmented {
		l.reassemble4(c, head, frameLen, ihl)
		return
	}
	if proto == ipProtoUDP && len(ip) >= ihl+8 {
		dport := binary.BigEndian.Uint16(ip[ihl+2:])
		if dport == 67 {
			if f := l.fullFrame(c, head, frameLen); f != nil {
				l.serve(stats.SvcDHCP, f)
			}
			return
		}
	}
	if l.handleIPv4Flow(c, head, frameLen, ihl, proto) {
		return
	}
	l.st.TX.Drops[stats.DropUnhandledProtocol].Add(1)
	l.logUnknown("untranslated IPv4", head)
}

// handleIPv6 dispatches an IPv6 frame. head is the copied start of the frame.
func (l *loop) handleIPv6(c *virtqueue.Chain, head []byte, frameLen int) {
	ip := head[ethHdrLen:]
	if len(ip) < 40 || ip[0]>>4 != 6 {
		l.st.TX.Drops[stats.DropMalformed].Add(1)
		return
	}
	next := ip[6]
	l4off := ipv6HdrLen
	if next != ipProtoFrag && isIPv6ExtensionHeader(next) {
		// Dispatch goes by the upper-layer protocol: walk the extension
		// headers (within the packet and the copy) to it.
		pl := int(binary.BigEndian.Uint16(ip[4:6]))
		ul, err := header.IPv6(ip[:min(len(ip), ipv6HdrLen+pl)]).UpperLayer()
		if err != nil {
			l.st.TX.Drops[stats.DropMalformed].Add(1)
			return
		}
		if ul.Fragment {
			l.fragDrop(stats.FragUnsupported) // only directly after the IPv6 header
			return
		}
		next, l4off = uint8(ul.Protocol), ul.Offset
	}
	l4 := ip[l4off:]
	switch next {
	case ipProtoFrag:
		l.reassemble6(c, head, frameLen)
		return
	case ipProtoICMPv6:
		if len(l4) >= 1 && l4[0] >= 133 && l4[0] <= 137 { // RS, RA, NS, NA, redirect
			if f := l.fullFrame(c, head, frameLen); f != nil {
				l.serve(stats.SvcNDP, f)
			}
			return
		}
	case ipProtoUDP:
		if len(l4) >= 8 && binary.BigEndian.Uint16(l4[2:]) == 547 {
			if f := l.fullFrame(c, head, frameLen); f != nil {
				l.serve(stats.SvcDHCPv6, f)
			}
			return
		}
	}
	if l.handleIPv6Flow(c, head, frameLen, next, l4off) {
		return
	}
	l.st.TX.Drops[stats.DropUnhandledProtocol].Add(1)
	l.logUnknown("untranslated IPv6", head)
}

// isIPv6ExtensionHeader reports whether next names an IPv6 extension
// header that header.IPv6.UpperLayer walks.
func isIPv6ExtensionHeader(next uint8) bool {
	switch header.IPProtocol(next) {
	case header.IPProtocolHopByHop, header.IPProtocolRouting, header.IPProtocolDestOptions,
		header.IPProtocolAH, header.IPProtocolFragment:
		return true
	}
	return false
}

// serve lets link service svc answer frame; a reply is queued for the guest
// and counted by what the service says it built.
func (l *loop) serve(svc stats.Service, frame []byte) {
	p := &l.tx.pkt
	if header.ParseFrame(frame, len(frame), p) != nil {
		return
	}
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
	if v != 0 && l.tcp != nil && l.tcp.guestMAC != mac {
		l.tcp.guestMAC = mac
	}
}

// logUnknown logs a frame the stack dropped, at most once per second per
// pair, and only when debug logging is on (building the line allocates).
func (l *loop) logUnknown(what string, head []byte) {
	if !l.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	if ok, _ := l.tx.logLimit.Allow(time.Now(), time.Second); !ok {
		return
	}
	et := binary.BigEndian.Uint16(head[12:14])
	proto := -1
	switch {
	case et == etherTypeIPv4 && len(head) >= ethHdrLen+20:
		proto = int(head[ethHdrLen+9])
	case et == etherTypeIPv6 && len(head) >= ethHdrLen+40:
		proto = int(head[ethHdrLen+6])
	}
	l.log.Debug("frame dropped", "why", what, "pair", l.qp.Index,
		"ethertype", et, "proto", proto, "dst", fmtMAC([6]byte(head[0:6])),
		"src", fmtMAC([6]byte(head[6:12])))
}

package tcpstack

import (
	"encoding/binary"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// IP reassembly of guest UDP and ICMP datagrams. A guest whose MTU is
// smaller than a datagram it sends fragments it (Linux does for UDP
// without DF, and for ping -s 8000 at MTU 1500); the host socket takes
// the whole datagram, so the fragments are put back together first.
//
// Memory is bounded and allocated once per loop: fragPoolSize buffers of
// one maximal datagram each. Fragments that overlap (a duplicate included,
// RFC 5722), a datagram longer than 65535 bytes or inconsistent lengths
// discard the whole datagram; one that does not complete in
// fragTimeout is discarded when its buffer is next looked at, and a new
// datagram with the pool full takes the oldest buffer. TCP fragments are
// not reassembled (the host socket sends its own segments; the guest's
// PMTU discovery copes) and are dropped, counted. IPv6 fragments are
// handled only when the Fragment header directly follows the IPv6 header
// (as Linux sends them); others are dropped, counted.

const (
	fragPoolSize = 4
	fragTimeout  = 30 * time.Second
	// fragMaxPayload bounds the reassembled L4 bytes (IPv4: 65535 minus
	// the IPv4 header; IPv6: the 16-bit payload length).
	fragMaxPayload = 65535
	// fragHeadroom: virtio-net header, Ethernet and the largest IPv4
	// header go in front of the payload when the datagram is handed on.
	fragHeadroom = virtqueue.NetHdrLen + header.EthernetMinimumSize + 60
	fragBlocks   = (fragMaxPayload + 7) / 8
)

// fragKey identifies the fragments of one datagram (RFC 791: source,
// destination, protocol, identification; RFC 8200: source, destination,
// identification).
type fragKey struct {
	v6       bool
	proto    uint8
	id       uint32
	src, dst [16]byte
}

// fragBuf collects one datagram.
type fragBuf struct {
	inUse    bool
	key      fragKey
	started  time.Time
	total    int // L4 length, known once the last fragment arrived; -1 before
	received int
	maxEnd   int
	haveHead bool // the offset-0 fragment supplied the headers
	ethHdr   [header.EthernetMinimumSize]byte
	ipHdr    [60]byte
	ipHdrLen int
	blocks   [(fragBlocks + 63) / 64]uint64
	buf      [fragHeadroom + fragMaxPayload]byte
}

// fragPool is one loop's reassembly state, allocated with the loop.
type fragPool struct {
	bufs  [fragPoolSize]fragBuf
	chain virtqueue.Chain // the reassembled frame as a chain for the TX handlers
	iov   [1][]byte
}

// fragment is what the TX path learned from one fragment's headers.
type fragment struct {
	key      fragKey
	off, n   int  // L4 byte offset and length
	more     bool // more fragments follow
	dataOff  int  // where the fragment's data starts in the frame
	l3HdrLen int  // IPv4 header length; IPv6 base header
	head     []byte
	frameLen int
}

// reassemble takes an IP fragment (p parsed from its copied start).
func (l *loop) reassemble(c *virtqueue.Chain, p *header.Packet) {
	fr := fragment{off: p.FragmentOffset, more: p.MoreFragments, head: p.Frame, frameLen: p.Len}
	if !p.IsIPv6() {
		if p.Protocol != header.IPProtocolUDP && p.Protocol != header.IPProtocolICMPv4 {
			l.fragDrop(stats.FragUnsupported)
			return
		}
		if p.L4Len <= 0 {
			l.fragDrop(stats.FragInvalid)
			return
		}
		fr.n, fr.dataOff, fr.l3HdrLen = p.L4Len, p.L4Off, p.L4Off-header.EthernetMinimumSize
		fr.key = fragKey{proto: uint8(p.Protocol), id: p.FragmentID}
		s, d := p.Src.As4(), p.Dst.As4()
		copy(fr.key.src[:4], s[:])
		copy(fr.key.dst[:4], d[:])
		l.addFragment(c, &fr)
		return
	}
	if p.FragmentHeaderOff != header.EthernetMinimumSize+header.IPv6MinimumSize {
		l.fragDrop(stats.FragUnsupported) // only directly after the IPv6 header
		return
	}
	next := header.IPProtocol(p.Frame[p.FragmentHeaderOff])
	if next != header.IPProtocolUDP && next != header.IPProtocolICMPv6 {
		l.fragDrop(stats.FragUnsupported)
		return
	}
	pl := p.L3Len - header.IPv6MinimumSize
	if pl <= header.IPv6FragmentHeaderSize {
		l.fragDrop(stats.FragInvalid)
		return
	}
	fr.n = pl - header.IPv6FragmentHeaderSize
	fr.dataOff, fr.l3HdrLen = header.EthernetMinimumSize+header.IPv6MinimumSize+header.IPv6FragmentHeaderSize, header.IPv6MinimumSize
	fr.key = fragKey{v6: true, proto: uint8(next), id: p.FragmentID, src: p.Src.As16(), dst: p.Dst.As16()}
	l.addFragment(c, &fr)
}

func (l *loop) fragDrop(o stats.FragOutcome) {
	l.st.Proto.Fragments[o].Add(1)
	l.st.TX.Drops[stats.DropFragment].Add(1)
}

// addFragment puts a fragment into its datagram's buffer and hands the
// datagram on when it is complete.
func (l *loop) addFragment(c *virtqueue.Chain, fr *fragment) {
	limit := fragMaxPayload
	if !fr.key.v6 {
		limit -= fr.l3HdrLen // the IPv4 total length counts the header
	}
	if fr.more && fr.n%8 != 0 || fr.off+fr.n > limit {
		l.fragDrop(stats.FragInvalid)
		return
	}
	p := l.frag
	b := p.find(l, &fr.key)
	if b.total >= 0 && (fr.off+fr.n > b.total || !fr.more && fr.off+fr.n != b.total) ||
		!fr.more && fr.off+fr.n < b.maxEnd {
		b.inUse = false
		l.fragDrop(stats.FragInvalid)
		return
	}
	first, last := fr.off/8, (fr.off+fr.n+7)/8
	for i := first; i < last; i++ {
		if b.blocks[i/64]&(1<<(i%64)) != 0 {
			b.inUse = false
			l.fragDrop(stats.FragOverlap)
			return
		}
	}
	for i := first; i < last; i++ {
		b.blocks[i/64] |= 1 << (i % 64)
	}
	header.CopyFromIovecs(b.buf[fragHeadroom+fr.off:fragHeadroom+fr.off+fr.n], c.Readable, l.vhLen+fr.dataOff)
	b.received += fr.n
	b.maxEnd = max(b.maxEnd, fr.off+fr.n)
	if !fr.more {
		b.total = fr.off + fr.n
	}
	if fr.off == 0 {
		b.haveHead = true
		copy(b.ethHdr[:], fr.head[:header.EthernetMinimumSize])
		b.ipHdrLen = copy(b.ipHdr[:fr.l3HdrLen], fr.head[header.EthernetMinimumSize:])
	}
	l.st.Proto.Fragments[stats.FragReceived].Add(1)
	if b.total < 0 || b.received != b.total || !b.haveHead {
		return
	}
	b.inUse = false
	if !b.key.v6 && b.ipHdrLen+b.total > 65535 {
		l.fragDrop(stats.FragInvalid) // a longer header on the first fragment
		return
	}
	l.st.Proto.Fragments[stats.FragReassembled].Add(1)
	l.dispatchReassembled(b)
}

// find returns the buffer of key's datagram, starting one (in a free,
// expired or else the oldest buffer) if none holds it.
func (p *fragPool) find(l *loop, key *fragKey) *fragBuf {
	var free, oldest *fragBuf
	for i := range p.bufs {
		b := &p.bufs[i]
		if b.inUse && l.now.Sub(b.started) >= fragTimeout {
			b.inUse = false
			l.st.Proto.Fragments[stats.FragTimeout].Add(1)
			l.st.TX.Drops[stats.DropFragment].Add(1)
		}
		if !b.inUse {
			if free == nil {
				free = b
			}
			continue
		}
		if b.key == *key {
			return b
		}
		if oldest == nil || b.started.Before(oldest.started) {
			oldest = b
		}
	}
	if free == nil {
		free = oldest
		l.st.Proto.Fragments[stats.FragEvicted].Add(1)
		l.st.TX.Drops[stats.DropFragment].Add(1)
	}
	b := free
	b.inUse, b.key, b.started = true, *key, l.now
	b.total, b.received, b.maxEnd, b.haveHead = -1, 0, 0, false
	b.blocks = [len(b.blocks)]uint64{}
	return b
}

// dispatchReassembled rebuilds the headers in front of the payload, as one
// unfragmented frame behind a zero virtio-net header, and runs it through
// the TX handlers as a one-buffer chain.
func (l *loop) dispatchReassembled(b *fragBuf) {
	vh := l.vhLen
	l3 := b.ipHdrLen
	start := fragHeadroom - l3 - header.EthernetMinimumSize - vh
	frame := b.buf[start : fragHeadroom+b.total]
	clear(frame[:vh])
	copy(frame[vh:], b.ethHdr[:])
	ip := frame[vh+header.EthernetMinimumSize : vh+header.EthernetMinimumSize+l3]
	copy(ip, b.ipHdr[:l3])
	if b.key.v6 {
		ip[6] = b.key.proto // the Fragment header is gone
		binary.BigEndian.PutUint16(ip[4:6], uint16(b.total))
	} else {
		binary.BigEndian.PutUint16(ip[2:4], uint16(l3+b.total))
		ip[6] &= 0x40 // keep DF, clear MF and the offset
		ip[7] = 0
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:12], ^header.Checksum(ip, 0))
	}
	fp := l.frag
	fp.iov[0] = frame
	fp.chain.Readable = fp.iov[:]
	frameLen := len(frame) - vh
	n := copy(l.tx.head[:vh+min(frameLen, txHeadLen)], frame)
	l.tx.hdr = virtqueue.NetHdr{} // the fragments' offload fields do not apply
	p := &l.tx.pkt
	if err := header.ParseFrame(l.tx.head[vh:n], frameLen, p); err != nil {
		l.st.TX.Drops[stats.DropMalformed].Add(1)
	} else {
		l.dispatchIP(&fp.chain, p)
		// A datagram queued for sendmmsg points into the buffer, which
		// the next fragment may take over.
		l.flushSends()
	}
	fp.chain.Readable = nil
}

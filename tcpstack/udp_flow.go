package tcpstack

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"golang.org/x/sys/unix"

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
	udpHdrLen   = 8
	ipv4HdrLen  = 20
	ipv6HdrLen  = 40
	maxUDPv4Pay = 65535 - ipv4HdrLen - udpHdrLen
	maxUDPv6Pay = 65535 - udpHdrLen
	defaultTTL  = 64
	// maxUSOSegments bounds the datagrams one USO frame may carry (Linux
	// sends at most 64 per GSO skb, UDP_MAX_SEGMENTS).
	maxUSOSegments = 128
)

// udpFromGuest sends a guest UDP datagram from its flow's socket, payload
// straight from guest memory.
func (l *loop) udpFromGuest(c *virtqueue.Chain, p *header.Packet) {
	st := l.st
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
	ft := l.flows
	key := packetKey(flowUDP, p, binary.BigEndian.Uint16(u[0:2]), binary.BigEndian.Uint16(u[2:4]))
	if key.remotePort == 0 {
		st.UDPDrop(stats.FromGuest, stats.DropMalformed)
		return
	}
	i, why, ok := ft.lookup(&key)
	if !ok {
		st.Proto.UDPDrops[stats.FromGuest][why].Add(1) // lookup counted the TX drop
		return
	}
	fd := ft.flows[i].fd
	off := l.vhLen + p.L4Off + udpHdrLen
	n := ulen - udpHdrLen
	// USO (GSO_UDP_L4): the frame carries several datagrams of GSOSize.
	seg := n
	if l.tx.hdr.GSOKind() == virtqueue.GSOUDPL4 && l.tx.hdr.GSOSize > 0 {
		seg = int(l.tx.hdr.GSOSize)
		if n/seg > maxUSOSegments {
			// A tiny segment size would turn one frame into thousands of
			// system calls; no real driver does that.
			st.UDPDrop(stats.FromGuest, stats.DropMalformed)
			return
		}
	}
	for {
		m := min(seg, n)
		_, err := ft.io.Send(fd, c.Readable, off, m)
		if err != nil {
			if errors.Is(err, unix.ECONNREFUSED) {
				// An ICMP error for an earlier datagram was queued on the
				// socket; this one was not sent. Try once more.
				_, err = ft.io.Send(fd, c.Readable, off, m)
			}
		}
		if err != nil {
			st.UDPDrop(stats.FromGuest, stats.DropSendError)
		} else {
			st.Proto.UDPDatagrams[stats.FromGuest].Add(1)
			st.Proto.UDPBytes[stats.FromGuest].Add(uint64(m))
		}
		off += m
		n -= m
		if n <= 0 {
			return
		}
	}
}

func (ft *flowTable) openUDP(key *flowKey, host netip.AddrPort) (int, error) {
	return ft.openDgram(host, 0)
}

// readUDP moves datagrams from flow i's socket into guest RX buffers.
func (ft *flowTable) readUDP(l *loop, i int32) flowRead {
	f := &ft.flows[i]
	w := &l.rx
	hl := ethHdrLen + ipv4HdrLen + udpHdrLen
	maxPay := maxUDPv4Pay
	if f.key.v6 {
		hl = ethHdrLen + ipv6HdrLen + udpHdrLen
		maxPay = maxUDPv6Pay
	}
	for b := 0; b < flowBudget; b++ {
		if !w.Enabled() {
			return ft.discardAll(f.fd)
		}
		hdr, pay, s := w.Reserve(hl, maxPay)
		plen := iovLen(pay)
		switch s {
		case guestring.OK:
		case guestring.NoFit, guestring.Broken:
			// The guest can never take it: consume and count.
			if n, _, err := ft.io.Recv(f.fd, ft.discardIO[:], 0); err == nil && n >= 0 {
				ft.st.UDPDrop(stats.ToGuest, stats.DropNoFit)
				continue
			}
			return flowDrained
		default:
			return flowBlocked
		}
		if plen < maxPay {
			// Is the next datagram larger than what we hold?
			size, err := hostsock.NextDatagram(f.fd)
			if err == nil && size > plen {
				w.Abort()
				if w.MoreLater() {
					return flowBlocked // wait for the guest to post more buffers
				}
				if n, _, err := ft.io.Recv(f.fd, ft.discardIO[:], 0); err == nil && n >= 0 {
					ft.st.UDPDrop(stats.ToGuest, stats.DropNoFit)
					continue
				}
				return flowDrained
			}
		}
		n, mflags, err := ft.io.Recv(f.fd, pay, 0)
		if err != nil {
			w.Abort()
			if errors.Is(err, unix.EAGAIN) {
				return flowDrained
			}
			if errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.EHOSTUNREACH) ||
				errors.Is(err, unix.ENETUNREACH) {
				continue // an ICMP error reported on the socket; data may follow
			}
			ft.warn("UDP flow receive failed, flow closed", "err", err)
			ft.closeFlow(i)
			return flowDrained
		}
		if mflags&unix.MSG_TRUNC != 0 {
			w.Abort()
			ft.st.UDPDrop(stats.ToGuest, stats.DropNoFit)
			continue
		}
		f.lastUsed = ft.now
		vh := ft.buildUDPHeaders(l, hdr, &f.key, pay, n)
		w.Commit(n, &vh)
		ft.st.Proto.UDPDatagrams[stats.ToGuest].Add(1)
		ft.st.Proto.UDPBytes[stats.ToGuest].Add(uint64(n))
	}
	return flowBudgetUsed
}

// discardAll reads and drops everything queued on fd (RX ring disabled: the
// vhost-user spec says frames are not supplied, not queued).
func (ft *flowTable) discardAll(fd int) flowRead {
	for {
		if _, _, err := ft.io.Recv(fd, ft.discardIO[:], 0); err != nil {
			return flowDrained
		}
		ft.st.RX.Drops[stats.DropRingDisabled].Add(1)
	}
}

// buildUDPHeaders writes Ethernet, IP and UDP headers for a datagram of n
// payload bytes (already in payload) from the flow's remote end to the
// guest, and returns the virtio-net header (checksum offload if the guest
// takes partial checksums, else a complete checksum).
func (ft *flowTable) buildUDPHeaders(l *loop, hdr []byte, key *flowKey, payload [][]byte, n int) virtqueue.NetHdr {
	src, dst := key.remoteAddr(), key.guestAddr()
	ipOff := ft.buildL2L3(l, hdr, key, header.IPProtocolUDP, udpHdrLen+n)
	u := hdr[ipOff:]
	header.EncodeUDP(u, key.remotePort, key.guestPort, uint16(udpHdrLen+n))
	if n > 0xffff-udpHdrLen {
		binary.BigEndian.PutUint16(u[4:6], 0) // cannot happen for IPv4; IPv6 jumbo is never built
	}
	pseudo := header.PseudoHeaderChecksum(header.IPProtocolUDP, src, dst, uint32(udpHdrLen+n))
	if l.guestCsum {
		binary.BigEndian.PutUint16(u[6:8], pseudo)
		return virtqueue.NetHdr{Flags: virtqueue.NetHdrFNeedsCsum, CsumStart: uint16(ipOff), CsumOffset: 6}
	}
	sum := header.Checksum(u[:udpHdrLen], pseudo)
	sum = header.ChecksumIovecs(payload, n, sum)
	c := ^sum
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:8], c)
	return virtqueue.NetHdr{}
}

// buildL2L3 writes the Ethernet and IP headers of a frame from the flow's
// remote end to the guest carrying l4Len bytes of proto, and returns the
// offset of the L4 header.
func (ft *flowTable) buildL2L3(l *loop, hdr []byte, key *flowKey, proto header.IPProtocol, l4Len int) int {
	guestMAC := header.BroadcastMAC
	if m, ok := l.s.GuestMAC(); ok {
		guestMAC = header.MAC(m)
	}
	src, dst := key.remoteAddr(), key.guestAddr()
	if key.v6 {
		header.EncodeEthernet(hdr, guestMAC, header.MAC(ft.cfg.ourMAC), header.EtherType(etherTypeIPv6))
		f := header.IPv6Fields{PayloadLength: uint16(l4Len), NextHeader: proto, HopLimit: defaultTTL,
			Source: src, Destination: dst}
		header.EncodeIPv6(hdr[ethHdrLen:], &f)
		return ethHdrLen + ipv6HdrLen
	}
	header.EncodeEthernet(hdr, guestMAC, header.MAC(ft.cfg.ourMAC), header.EtherType(etherTypeIPv4))
	f := header.IPv4Fields{TotalLength: uint16(ipv4HdrLen + l4Len), ID: ft.nextIPID(), TTL: defaultTTL,
		Protocol: proto, Source: src, Destination: dst}
	header.EncodeIPv4(hdr[ethHdrLen:], &f)
	return ethHdrLen + ipv4HdrLen
}

// iovLen is the total length of bufs.
func iovLen(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}

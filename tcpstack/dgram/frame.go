package dgram

import (
	"encoding/binary"

	"vunet/tcpstack/header"
	"vunet/virtqueue"
)

// hopLimit is the TTL / hop limit of the frames the flows build.
const hopLimit = 64

// buildUDPHeaders writes Ethernet, IP and UDP headers for a datagram of n
// payload bytes (already in payload) from the flow's remote end to the
// guest, and the virtio-net header fields for it into ft.vh (checksum
// offload if the guest takes partial checksums, else a complete checksum).
// ft.vh is a table field, not a local: a pointer to it goes through the
// Sink interface, which would make a local escape.
func (ft *Table) buildUDPHeaders(hdr []byte, key *flowKey, payload [][]byte, n int) {
	src, dst := key.remoteAddr(), key.guestAddr()
	ipOff := ft.buildL2L3(hdr, key, header.IPProtocolUDP, udpHdrLen+n)
	u := hdr[ipOff:]
	header.EncodeUDP(u, key.remotePort, key.guestPort, uint16(udpHdrLen+n))
	if n > 0xffff-udpHdrLen {
		binary.BigEndian.PutUint16(u[4:6], 0) // cannot happen for IPv4; IPv6 jumbo is never built
	}
	pseudo := header.PseudoHeaderChecksum(header.IPProtocolUDP, src, dst, uint32(udpHdrLen+n))
	if ft.guestCsum {
		binary.BigEndian.PutUint16(u[6:8], pseudo)
		ft.vh = virtqueue.NetHdr{Flags: virtqueue.NetHdrFNeedsCsum, CsumStart: uint16(ipOff), CsumOffset: 6}
		return
	}
	sum := header.Checksum(u[:udpHdrLen], pseudo)
	sum = header.ChecksumIovecs(payload, n, sum)
	c := ^sum
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:8], c)
	ft.vh = virtqueue.NetHdr{}
}

// buildL2L3 writes the Ethernet and IP headers of a frame from the flow's
// remote end to the guest carrying l4Len bytes of proto, and returns the
// offset of the L4 header.
func (ft *Table) buildL2L3(hdr []byte, key *flowKey, proto header.IPProtocol, l4Len int) int {
	guestMAC := header.BroadcastMAC
	if ft.cfg.GuestMAC != nil {
		if m, ok := ft.cfg.GuestMAC.GuestMAC(); ok {
			guestMAC = header.MAC(m)
		}
	}
	src, dst := key.remoteAddr(), key.guestAddr()
	off := header.EthernetMinimumSize
	if key.v6 {
		header.EncodeEthernet(hdr, guestMAC, ft.cfg.OurMAC, header.EtherTypeIPv6)
		f := header.IPv6Fields{PayloadLength: uint16(l4Len), NextHeader: proto, HopLimit: hopLimit,
			Source: src, Destination: dst}
		return off + header.EncodeIPv6(hdr[off:], &f)
	}
	header.EncodeEthernet(hdr, guestMAC, ft.cfg.OurMAC, header.EtherTypeIPv4)
	f := header.IPv4Fields{TotalLength: uint16(header.IPv4MinimumSize + l4Len), ID: ft.nextIPID(), TTL: hopLimit,
		Protocol: proto, Source: src, Destination: dst}
	return off + header.EncodeIPv4(hdr[off:], &f)
}

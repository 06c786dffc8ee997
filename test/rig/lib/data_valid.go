package rig

import (
	"encoding/binary"
)

// virtio-net header flags (virtio 1.x 5.1.6).
const (
	hdrFlagNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM: the device left the L4 checksum partial
	hdrFlagDataValid = 2 // VIRTIO_NET_HDR_F_DATA_VALID: the device vouches for the checksum
)

// trustDataValid makes a TAP accept a received frame the way a Linux virtio
// guest does. A virtio-net driver that sees VIRTIO_NET_HDR_F_DATA_VALID
// marks the skb CHECKSUM_UNNECESSARY and never looks at the L4 checksum,
// so back-ends such as passt leave TCP and UDP checksums unset for
// (trusting) guests. A TAP ignores DATA_VALID on write and the namespace's
// kernel would drop those frames as corrupt. So the frame is turned into
// its NEEDS_CSUM equivalent: csum_start/csum_offset point at the TCP or UDP
// checksum, which gets the pseudo-header sum, and the kernel takes the
// frame as CHECKSUM_PARTIAL — trusted, as the virtio guest would, and with
// no per-byte work here (the rig's CPU is not the back-end's, but a rig
// that summed every byte would cap what the peer rows can show).
//
// buf is the first RX buffer: the virtio-net header (hdrLen bytes), then
// the Ethernet frame, of which frameLen bytes exist in all buffers
// together. Frames without DATA_VALID, with NEEDS_CSUM already, or that
// are not TCP or UDP over IPv4 or IPv6 (no extension headers, not a
// fragment) are left alone. It reports whether it changed the header.
func trustDataValid(buf []byte, hdrLen, frameLen int) bool {
	if hdrLen < 10 || len(buf) < hdrLen {
		return false
	}
	if buf[0]&hdrFlagDataValid == 0 || buf[0]&hdrFlagNeedsCsum != 0 {
		return false
	}
	f := buf[hdrLen:]
	if len(f) < 14 {
		return false
	}
	var sum uint32
	var l4off, l4len int
	var proto byte
	switch binary.BigEndian.Uint16(f[12:14]) {
	case 0x0800:
		ip := f[14:]
		if len(ip) < 20 || ip[0]>>4 != 4 {
			return false
		}
		ihl := int(ip[0]&0xf) * 4
		tot := int(binary.BigEndian.Uint16(ip[2:4]))
		if ihl < 20 || tot < ihl || 14+tot > frameLen || binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 {
			return false
		}
		proto = ip[9]
		l4off, l4len = 14+ihl, tot-ihl
		sum = sum16(ip[12:20])
	case 0x86dd:
		ip := f[14:]
		if len(ip) < 40 || ip[0]>>4 != 6 {
			return false
		}
		pl := int(binary.BigEndian.Uint16(ip[4:6]))
		if 14+40+pl > frameLen {
			return false
		}
		proto = ip[6]
		l4off, l4len = 14+40, pl
		sum = sum16(ip[8:40])
	default:
		return false
	}
	var csumOff int
	switch proto {
	case 6:
		csumOff = 16
	case 17:
		csumOff = 6
	default:
		return false
	}
	if l4off+csumOff+2 > len(f) || l4len < csumOff+2 {
		return false
	}
	sum += uint32(proto) + uint32(l4len)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(f[l4off+csumOff:], uint16(sum))
	buf[0] = buf[0]&^hdrFlagDataValid | hdrFlagNeedsCsum
	binary.LittleEndian.PutUint16(buf[6:8], uint16(l4off))
	binary.LittleEndian.PutUint16(buf[8:10], uint16(csumOff))
	return true
}

// sum16 adds b as big-endian 16-bit words (len(b) even), unfolded.
func sum16(b []byte) uint32 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	return s
}

package header

import (
	"encoding/binary"
	"net/netip"
)

// Packet is what ParseFrame learns from the headers of one guest frame: the
// Ethernet header, the IP header (with IPv6 extension headers walked to the
// upper layer) and, for TCP, the TCP header. The data path parses each frame
// once, into a Packet, and hands the Packet to whoever handles the frame;
// nobody reads an IP header by hand again.
//
// Offsets count from the start of the frame (the Ethernet header). Every
// length in a Packet has been checked against the frame's length and, for
// the bytes a field points into, against the parsed copy.
type Packet struct {
	// Frame is the bytes parsed: the frame's start, often a copy of only
	// its first bytes.
	Frame []byte
	// Len is the length of the whole frame, at least len(Frame).
	Len int
	// EtherType is the Ethernet payload's type. For anything but IPv4
	// and IPv6 the fields below are zero.
	EtherType EtherType

	// Src and Dst are the IP source and destination.
	Src, Dst netip.Addr
	// HopLimit is the IPv4 TTL or the IPv6 hop limit.
	HopLimit uint8
	// Protocol is the upper-layer protocol: IPv4's protocol field, or the
	// IPv6 next header after the extension headers. For a fragment that
	// is not the first, it is the Fragment header's next header.
	Protocol IPProtocol
	// L3Len is the IP packet's length by its header (IPv4 total length,
	// IPv6 40 + payload length); the frame may carry padding after it.
	L3Len int
	// L4Off is the offset of the upper-layer header; L4Len the upper
	// layer's length by the IP header (extension headers excluded).
	L4Off, L4Len int
	// L4 is the upper layer's bytes within Frame: L4Len of them, or fewer
	// when Frame is a copy that ends first.
	L4 []byte

	// Fragment is set for an IPv4 fragment (MF or an offset) and for an
	// IPv6 packet with a Fragment header.
	Fragment bool
	// FragmentOffset (bytes), MoreFragments and FragmentID are the
	// fragment's fields.
	FragmentOffset int
	MoreFragments  bool
	FragmentID     uint32
	// FragmentHeaderOff is the offset of the IPv6 Fragment header (0 for
	// IPv4).
	FragmentHeaderOff int

	// TCP is the TCP header, options included, when Protocol is TCP, the
	// packet is not a fragment and the header is whole within L4 (nil
	// otherwise).
	TCP TCP
}

// IsIP reports whether the frame carries IPv4 or IPv6.
func (p *Packet) IsIP() bool {
	return p.EtherType == EtherTypeIPv4 || p.EtherType == EtherTypeIPv6
}

// IsIPv6 reports whether the frame carries IPv6.
func (p *Packet) IsIPv6() bool { return p.EtherType == EtherTypeIPv6 }

// SourceMAC returns the Ethernet source address.
func (p *Packet) SourceMAC() MAC { return MAC(p.Frame[6:12]) }

// Ports returns the source and destination ports of a TCP or UDP header
// whose first four bytes are in L4; ok is false otherwise.
func (p *Packet) Ports() (src, dst uint16, ok bool) {
	if len(p.L4) < 4 || p.Fragment && p.FragmentOffset != 0 {
		return 0, 0, false
	}
	return binary.BigEndian.Uint16(p.L4[0:2]), binary.BigEndian.Uint16(p.L4[2:4]), true
}

// ParseFrame parses the headers at the start of b, the first bytes (or all)
// of a frame of frameLen bytes, Ethernet onward, into p. It returns an error
// when the Ethernet or IP header is malformed: too short for the copy,
// a wrong IP version or header length, an IP length beyond the frame, an
// IPv6 extension-header chain that runs past the packet or its bound.
// A TCP header that is missing or malformed is not an error: p.TCP stays
// nil. ParseFrame does not allocate.
func ParseFrame(b []byte, frameLen int, p *Packet) error {
	*p = Packet{Frame: b, Len: frameLen}
	if len(b) < EthernetMinimumSize || frameLen < len(b) {
		return ErrTruncated
	}
	p.EtherType = EtherType(binary.BigEndian.Uint16(b[12:14]))
	l3 := b[EthernetMinimumSize:]
	var err error
	switch p.EtherType {
	case EtherTypeIPv4:
		err = p.parseIPv4(l3)
	case EtherTypeIPv6:
		err = p.parseIPv6(l3)
	default:
		return nil
	}
	if err != nil {
		return err
	}
	p.L4 = b[min(len(b), p.L4Off):min(len(b), p.L4Off+p.L4Len)]
	if p.Protocol == IPProtocolTCP && !p.Fragment {
		if th, err := ParseTCP(p.L4); err == nil {
			p.TCP = th[:th.DataOffset()]
		}
	}
	return nil
}

func (p *Packet) parseIPv4(l3 []byte) error {
	if len(l3) < IPv4MinimumSize {
		return ErrTruncated
	}
	if l3[0]>>4 != 4 {
		return ErrVersion
	}
	ihl := int(l3[0]&0xf) * 4
	if ihl < IPv4MinimumSize {
		return ErrBadLength
	}
	if len(l3) < ihl {
		return ErrTruncated
	}
	total := int(binary.BigEndian.Uint16(l3[2:4]))
	if total < ihl {
		return ErrBadLength
	}
	if EthernetMinimumSize+total > p.Len {
		return ErrTruncated
	}
	p.Src = netip.AddrFrom4([4]byte(l3[12:16]))
	p.Dst = netip.AddrFrom4([4]byte(l3[16:20]))
	p.HopLimit = l3[8]
	p.Protocol = IPProtocol(l3[9])
	p.L3Len = total
	p.L4Off = EthernetMinimumSize + ihl
	p.L4Len = total - ihl
	ff := binary.BigEndian.Uint16(l3[6:8])
	if ff&(IPv4FlagMoreFragments|ipv4FragmentOffsetMask) != 0 {
		p.Fragment = true
		p.FragmentOffset = int(ff&ipv4FragmentOffsetMask) * 8
		p.MoreFragments = ff&IPv4FlagMoreFragments != 0
		p.FragmentID = uint32(binary.BigEndian.Uint16(l3[4:6]))
	}
	return nil
}

func (p *Packet) parseIPv6(l3 []byte) error {
	if len(l3) < IPv6MinimumSize {
		return ErrTruncated
	}
	if l3[0]>>4 != 6 {
		return ErrVersion
	}
	total := IPv6MinimumSize + int(binary.BigEndian.Uint16(l3[4:6]))
	if EthernetMinimumSize+total > p.Len {
		return ErrTruncated
	}
	p.Src = netip.AddrFrom16([16]byte(l3[8:24]))
	p.Dst = netip.AddrFrom16([16]byte(l3[24:40]))
	p.HopLimit = l3[7]
	p.L3Len = total
	// The walk sees the packet's bytes within the copy; a header that runs
	// past either is an error (past the copy: we cannot tell what follows).
	ul, err := IPv6(l3[:min(len(l3), total)]).UpperLayer()
	if err != nil {
		return err
	}
	p.Protocol = ul.Protocol
	p.L4Off = EthernetMinimumSize + ul.Offset
	p.L4Len = total - ul.Offset
	if ul.Fragment {
		p.Fragment = true
		p.FragmentOffset = ul.FragmentOffset
		p.MoreFragments = ul.MoreFragments
		p.FragmentID = ul.FragmentID
		p.FragmentHeaderOff = EthernetMinimumSize + ul.FragmentHeaderOffset
	}
	return nil
}

package header

import (
	"encoding/binary"
	"net/netip"
)

// IPv6 header sizes and limits.
const (
	IPv6MinimumSize = 40
	// IPv6MaxExtensionHeaders bounds the extension-header walk so a guest
	// cannot make us spin over a long chain of tiny headers.
	IPv6MaxExtensionHeaders = 8
	// IPv6FragmentHeaderSize is the fixed size of the Fragment header.
	IPv6FragmentHeaderSize = 8
)

// Well-known IPv6 addresses used on the guest link.
var (
	// IPv6AllNodes is ff02::1.
	IPv6AllNodes = netip.AddrFrom16([16]byte{0xff, 0x02, 15: 1})
	// IPv6AllRouters is ff02::2.
	IPv6AllRouters = netip.AddrFrom16([16]byte{0xff, 0x02, 15: 2})
	// IPv6AllDHCPRelayAgentsAndServers is ff02::1:2, where DHCPv6 clients send.
	IPv6AllDHCPRelayAgentsAndServers = netip.AddrFrom16([16]byte{0xff, 0x02, 13: 1, 15: 2})
)

// IPv6 is a view of an IPv6 packet, fixed header first.
type IPv6 []byte

// ParseIPv6 validates the fixed IPv6 header at the start of b and returns a
// view trimmed to 40 + Payload Length (dropping Ethernet padding). A zero
// Payload Length (jumbogram) is treated as an empty payload; jumbograms
// cannot occur on a link whose MTU is below 65575.
func ParseIPv6(b []byte) (IPv6, error) {
	if len(b) < IPv6MinimumSize {
		return nil, ErrTruncated
	}
	if b[0]>>4 != 6 {
		return nil, ErrVersion
	}
	n := IPv6MinimumSize + int(binary.BigEndian.Uint16(b[4:6]))
	if n > len(b) {
		return nil, ErrTruncated
	}
	return IPv6(b[:n]), nil
}

// TrafficClass returns the 8-bit traffic class.
func (h IPv6) TrafficClass() uint8 { return uint8(binary.BigEndian.Uint16(h[0:2]) >> 4) }

// FlowLabel returns the 20-bit flow label.
func (h IPv6) FlowLabel() uint32 { return binary.BigEndian.Uint32(h[0:4]) & 0xfffff }

// PayloadLength returns the Payload Length field (extension headers included).
func (h IPv6) PayloadLength() uint16 { return binary.BigEndian.Uint16(h[4:6]) }

// NextHeader returns the Next Header field of the fixed header.
func (h IPv6) NextHeader() IPProtocol { return IPProtocol(h[6]) }

// HopLimit returns the Hop Limit.
func (h IPv6) HopLimit() uint8 { return h[7] }

// Source returns the source address.
func (h IPv6) Source() netip.Addr { return netip.AddrFrom16([16]byte(h[8:24])) }

// Destination returns the destination address.
func (h IPv6) Destination() netip.Addr { return netip.AddrFrom16([16]byte(h[24:40])) }

// Payload returns everything after the fixed header, extension headers included.
func (h IPv6) Payload() []byte { return h[IPv6MinimumSize:] }

// IPv6UpperLayer describes where the upper-layer protocol starts after the
// extension headers.
type IPv6UpperLayer struct {
	// Protocol is the upper-layer protocol (IPProtocolNoNext if the chain
	// ends with No Next Header).
	Protocol IPProtocol
	// Offset is the byte offset of the upper-layer header from the start of
	// the IPv6 packet.
	Offset int
	// Fragment is true when a Fragment header was seen.
	Fragment bool
	// FragmentOffset is the fragment offset in bytes (from the Fragment header).
	FragmentOffset int
	// MoreFragments is the M flag of the Fragment header.
	MoreFragments bool
	// FragmentID is the Identification of the Fragment header.
	FragmentID uint32
	// FragmentHeaderOffset is the byte offset of the Fragment header from
	// the start of the IPv6 packet.
	FragmentHeaderOffset int
}

// UpperLayer walks the extension headers (Hop-by-Hop, Routing, Fragment,
// Destination Options, Authentication) to the upper-layer protocol, visiting
// at most IPv6MaxExtensionHeaders. A non-first fragment stops the walk at the
// Fragment header, because what follows is not a header. Errors: ErrTruncated
// when a header runs past the packet, ErrTooManyHeaders past the bound.
func (h IPv6) UpperLayer() (IPv6UpperLayer, error) {
	var u IPv6UpperLayer
	next := h.NextHeader()
	off := IPv6MinimumSize
	for i := 0; ; i++ {
		switch next {
		case IPProtocolHopByHop, IPProtocolRouting, IPProtocolDestOptions, IPProtocolAH, IPProtocolFragment:
		default:
			u.Protocol, u.Offset = next, off
			return u, nil
		}
		if i == IPv6MaxExtensionHeaders {
			return u, ErrTooManyHeaders
		}
		if next == IPProtocolHopByHop && i != 0 {
			// RFC 8200 4.3: Hop-by-Hop only directly after the fixed header.
			return u, ErrBadOption
		}
		if len(h)-off < 8 {
			return u, ErrTruncated
		}
		var l int
		switch next {
		case IPProtocolFragment:
			l = IPv6FragmentHeaderSize
			fo := binary.BigEndian.Uint16(h[off+2 : off+4])
			u.Fragment = true
			u.FragmentHeaderOffset = off
			u.FragmentOffset = int(fo>>3) * 8
			u.MoreFragments = fo&1 != 0
			u.FragmentID = binary.BigEndian.Uint32(h[off+4 : off+8])
			if u.FragmentOffset != 0 {
				u.Protocol, u.Offset = IPProtocol(h[off]), off+l
				return u, nil
			}
		case IPProtocolAH:
			l = (int(h[off+1]) + 2) * 4
		default:
			l = (int(h[off+1]) + 1) * 8
		}
		if len(h)-off < l {
			return u, ErrTruncated
		}
		next = IPProtocol(h[off])
		off += l
	}
}

// IPv6Fields holds the values EncodeIPv6 writes.
type IPv6Fields struct {
	TrafficClass  uint8
	FlowLabel     uint32
	PayloadLength uint16
	NextHeader    IPProtocol
	HopLimit      uint8
	Source        netip.Addr
	Destination   netip.Addr
}

// EncodeIPv6 writes a 40-byte IPv6 header into b and returns 40, or 0 when b
// is too short.
func EncodeIPv6(b []byte, f *IPv6Fields) int {
	if len(b) < IPv6MinimumSize {
		return 0
	}
	binary.BigEndian.PutUint32(b[0:4], 6<<28|uint32(f.TrafficClass)<<20|f.FlowLabel&0xfffff)
	binary.BigEndian.PutUint16(b[4:6], f.PayloadLength)
	b[6] = uint8(f.NextHeader)
	b[7] = f.HopLimit
	s, d := f.Source.As16(), f.Destination.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
	return IPv6MinimumSize
}

// SolicitedNodeMulticast returns ff02::1:ffXX:XXXX for addr (RFC 4291 2.7.1),
// the group a Neighbor Solicitation for addr is sent to.
func SolicitedNodeMulticast(addr netip.Addr) netip.Addr {
	a := addr.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 11: 1, 12: 0xff, 13: a[13], 14: a[14], 15: a[15]})
}

package header

import (
	"encoding/binary"
	"net/netip"
)

// UDPMinimumSize is the length of the UDP header.
const UDPMinimumSize = 8

// UDP is a view of a UDP datagram, header first.
type UDP []byte

// ParseUDP validates the UDP header at the start of b (the IP payload) and
// returns a view trimmed to the UDP Length field, which must cover the
// header and fit in b.
func ParseUDP(b []byte) (UDP, error) {
	if len(b) < UDPMinimumSize {
		return nil, ErrTruncated
	}
	l := int(binary.BigEndian.Uint16(b[4:6]))
	if l < UDPMinimumSize {
		return nil, ErrBadLength
	}
	if l > len(b) {
		return nil, ErrTruncated
	}
	return UDP(b[:l]), nil
}

// SourcePort returns the source port.
func (u UDP) SourcePort() uint16 { return binary.BigEndian.Uint16(u[0:2]) }

// DestinationPort returns the destination port.
func (u UDP) DestinationPort() uint16 { return binary.BigEndian.Uint16(u[2:4]) }

// Length returns the Length field (header + payload).
func (u UDP) Length() uint16 { return binary.BigEndian.Uint16(u[4:6]) }

// Checksum returns the checksum field (0 means "none" over IPv4).
func (u UDP) Checksum() uint16 { return binary.BigEndian.Uint16(u[6:8]) }

// Payload returns the datagram's data.
func (u UDP) Payload() []byte { return u[UDPMinimumSize:] }

// IsChecksumValid verifies the checksum with the pseudo-header of src and
// dst. A zero checksum is accepted over IPv4 (RFC 768: not computed) and
// rejected over IPv6 (RFC 8200 8.1: mandatory).
func (u UDP) IsChecksumValid(src, dst netip.Addr) bool {
	if u.Checksum() == 0 {
		return src.Is4()
	}
	return Checksum(u, PseudoHeaderChecksum(IPProtocolUDP, src, dst, uint32(len(u)))) == 0xffff
}

// SetChecksum computes the checksum over header and payload with the
// pseudo-header of src and dst. A computed zero is sent as 0xffff (RFC 768).
func (u UDP) SetChecksum(src, dst netip.Addr) {
	u[6], u[7] = 0, 0
	c := ^Checksum(u, PseudoHeaderChecksum(IPProtocolUDP, src, dst, uint32(len(u))))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:8], c)
}

// EncodeUDP writes a UDP header (zero checksum) into b and returns 8, or 0
// when b is too short. length is header plus payload.
func EncodeUDP(b []byte, srcPort, dstPort, length uint16) int {
	if len(b) < UDPMinimumSize {
		return 0
	}
	binary.BigEndian.PutUint16(b[0:2], srcPort)
	binary.BigEndian.PutUint16(b[2:4], dstPort)
	binary.BigEndian.PutUint16(b[4:6], length)
	b[6], b[7] = 0, 0
	return UDPMinimumSize
}

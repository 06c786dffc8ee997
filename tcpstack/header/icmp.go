package header

import (
	"encoding/binary"
	"net/netip"
)

// ICMPv4Type is the type byte of an ICMPv4 message.
type ICMPv4Type uint8

// ICMPv4 types the translator handles.
const (
	ICMPv4EchoReply      ICMPv4Type = 0
	ICMPv4DstUnreachable ICMPv4Type = 3
	ICMPv4EchoRequest    ICMPv4Type = 8
	ICMPv4TimeExceeded   ICMPv4Type = 11
	ICMPv4ParamProblem   ICMPv4Type = 12
)

// ICMPv6Type is the type byte of an ICMPv6 message.
type ICMPv6Type uint8

// ICMPv6 types the translator and NDP handle.
const (
	ICMPv6DstUnreachable     ICMPv6Type = 1
	ICMPv6PacketTooBig       ICMPv6Type = 2
	ICMPv6TimeExceeded       ICMPv6Type = 3
	ICMPv6ParamProblem       ICMPv6Type = 4
	ICMPv6EchoRequest        ICMPv6Type = 128
	ICMPv6EchoReply          ICMPv6Type = 129
	ICMPv6RouterSolicit      ICMPv6Type = 133
	ICMPv6RouterAdvert       ICMPv6Type = 134
	ICMPv6NeighborSolicit    ICMPv6Type = 135
	ICMPv6NeighborAdvert     ICMPv6Type = 136
	ICMPv6RedirectMsg        ICMPv6Type = 137
	ICMPv6MulticastListener2 ICMPv6Type = 143
)

// ICMPMinimumSize is the length of the ICMP header common to both versions:
// type, code, checksum and four bytes of type-specific data (for echo: the
// identifier and sequence number).
const ICMPMinimumSize = 8

// ICMPv4 is a view of an ICMPv4 message.
type ICMPv4 []byte

// ParseICMPv4 checks that b holds at least the 8-byte ICMP header.
func ParseICMPv4(b []byte) (ICMPv4, error) { return parseICMP[ICMPv4](b) }

// Type returns the message type.
func (m ICMPv4) Type() ICMPv4Type { return ICMPv4Type(m[0]) }

// Code returns the message code.
func (m ICMPv4) Code() uint8 { return m[1] }

// Checksum returns the checksum field.
func (m ICMPv4) Checksum() uint16 { return binary.BigEndian.Uint16(m[2:4]) }

// Ident returns the echo identifier (meaningful for echo messages only).
func (m ICMPv4) Ident() uint16 { return binary.BigEndian.Uint16(m[4:6]) }

// Sequence returns the echo sequence number.
func (m ICMPv4) Sequence() uint16 { return binary.BigEndian.Uint16(m[6:8]) }

// Payload returns the bytes after the 8-byte header.
func (m ICMPv4) Payload() []byte { return m[ICMPMinimumSize:] }

// SetIdent rewrites the echo identifier and patches the checksum.
func (m ICMPv4) SetIdent(id uint16) { setEchoIdent(m, id) }

// IsChecksumValid reports whether the ICMPv4 checksum (over the whole
// message, no pseudo-header) verifies.
func (m ICMPv4) IsChecksumValid() bool { return Checksum(m, 0) == 0xffff }

// SetChecksum computes the ICMPv4 checksum over the whole message.
func (m ICMPv4) SetChecksum() {
	m[2], m[3] = 0, 0
	binary.BigEndian.PutUint16(m[2:4], ^Checksum(m, 0))
}

// EncodeICMPv4Echo writes an echo header (type, code 0, ident, sequence; zero
// checksum) into b and returns 8, or 0 when b is too short. Call SetChecksum
// once the payload is in place.
func EncodeICMPv4Echo(b []byte, t ICMPv4Type, ident, seq uint16) int {
	return encodeEcho(b, uint8(t), ident, seq)
}

// ICMPv6 is a view of an ICMPv6 message.
type ICMPv6 []byte

// ICMPv6HeaderSize is the type/code/checksum prefix every ICMPv6 message
// has; NDP bodies start right after it.
const ICMPv6HeaderSize = 4

// ParseICMPv6 checks that b holds at least the 8-byte ICMP header (every
// ICMPv6 message type, NDP included, is at least that long).
func ParseICMPv6(b []byte) (ICMPv6, error) { return parseICMP[ICMPv6](b) }

// Type returns the message type.
func (m ICMPv6) Type() ICMPv6Type { return ICMPv6Type(m[0]) }

// Code returns the message code.
func (m ICMPv6) Code() uint8 { return m[1] }

// Checksum returns the checksum field.
func (m ICMPv6) Checksum() uint16 { return binary.BigEndian.Uint16(m[2:4]) }

// Ident returns the echo identifier (meaningful for echo messages only).
func (m ICMPv6) Ident() uint16 { return binary.BigEndian.Uint16(m[4:6]) }

// Sequence returns the echo sequence number.
func (m ICMPv6) Sequence() uint16 { return binary.BigEndian.Uint16(m[6:8]) }

// Body returns the message after the 4-byte type/code/checksum prefix; NDP
// views (NDPNeighborSolicit and friends) are built over it.
func (m ICMPv6) Body() []byte { return m[ICMPv6HeaderSize:] }

// Payload returns the bytes after the 8-byte header (the echo data).
func (m ICMPv6) Payload() []byte { return m[ICMPMinimumSize:] }

// SetIdent rewrites the echo identifier and patches the checksum.
func (m ICMPv6) SetIdent(id uint16) { setEchoIdent(m, id) }

// IsChecksumValid reports whether the checksum verifies with the IPv6
// pseudo-header of src and dst.
func (m ICMPv6) IsChecksumValid(src, dst netip.Addr) bool {
	return Checksum(m, PseudoHeaderChecksum(IPProtocolICMPv6, src, dst, uint32(len(m)))) == 0xffff
}

// SetChecksum computes the checksum with the IPv6 pseudo-header.
func (m ICMPv6) SetChecksum(src, dst netip.Addr) {
	m[2], m[3] = 0, 0
	binary.BigEndian.PutUint16(m[2:4], ^Checksum(m, PseudoHeaderChecksum(IPProtocolICMPv6, src, dst, uint32(len(m)))))
}

// EncodeICMPv6Echo writes an echo header (type, code 0, ident, sequence; zero
// checksum) into b and returns 8, or 0 when b is too short.
func EncodeICMPv6Echo(b []byte, t ICMPv6Type, ident, seq uint16) int {
	return encodeEcho(b, uint8(t), ident, seq)
}

// What ICMPv4 and ICMPv6 share: the 8-byte header (type, code, checksum,
// and for echo messages the identifier and sequence number).

// parseICMP checks that b holds at least the 8-byte ICMP header.
func parseICMP[M ~[]byte](b []byte) (M, error) {
	if len(b) < ICMPMinimumSize {
		return nil, ErrTruncated
	}
	return M(b), nil
}

// setEchoIdent rewrites an echo message's identifier and patches its
// checksum (the identifier's share of it; the pseudo-header's, for
// ICMPv6, does not change).
func setEchoIdent(m []byte, id uint16) {
	old := binary.BigEndian.Uint16(m[4:6])
	binary.BigEndian.PutUint16(m[4:6], id)
	binary.BigEndian.PutUint16(m[2:4], ChecksumUpdate(binary.BigEndian.Uint16(m[2:4]), old, id))
}

// encodeEcho writes an echo header of type typ (code 0, zero checksum)
// into b and returns 8, or 0 when b is too short.
func encodeEcho(b []byte, typ uint8, ident, seq uint16) int {
	if len(b) < ICMPMinimumSize {
		return 0
	}
	b[0], b[1], b[2], b[3] = typ, 0, 0, 0
	binary.BigEndian.PutUint16(b[4:6], ident)
	binary.BigEndian.PutUint16(b[6:8], seq)
	return ICMPMinimumSize
}

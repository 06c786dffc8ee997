package header

import (
	"encoding/binary"
	"net/netip"
)

// IPProtocol is an IPv4 protocol / IPv6 next-header number.
type IPProtocol uint8

// IP protocol numbers this package knows.
const (
	IPProtocolHopByHop    IPProtocol = 0
	IPProtocolICMPv4      IPProtocol = 1
	IPProtocolTCP         IPProtocol = 6
	IPProtocolUDP         IPProtocol = 17
	IPProtocolRouting     IPProtocol = 43
	IPProtocolFragment    IPProtocol = 44
	IPProtocolESP         IPProtocol = 50
	IPProtocolAH          IPProtocol = 51
	IPProtocolICMPv6      IPProtocol = 58
	IPProtocolNoNext      IPProtocol = 59
	IPProtocolDestOptions IPProtocol = 60
)

// IPv4 header sizes and field limits.
const (
	IPv4MinimumSize = 20
	IPv4MaximumSize = 60
	// IPv4MaximumPacketSize is the largest value of Total Length.
	IPv4MaximumPacketSize = 65535
)

// IPv4 flag bits as they sit in the flags/fragment-offset word.
const (
	IPv4FlagDontFragment   = 0x4000
	IPv4FlagMoreFragments  = 0x2000
	ipv4FragmentOffsetMask = 0x1fff
)

// IPv4 option types that matter to a parser (RFC 791).
const (
	IPv4OptionEndOfList = 0
	IPv4OptionNOP       = 1
)

// IPv4 is a view of an IPv4 packet, header first.
type IPv4 []byte

// ParseIPv4 validates the IPv4 header at the start of b and returns a view
// trimmed to Total Length (so Ethernet padding is dropped). It checks the
// version, that IHL covers at least 20 bytes and fits in b, and that Total
// Length covers the header and fits in b. It does not verify the header
// checksum (see IsChecksumValid) because offloading front-ends may leave it.
func ParseIPv4(b []byte) (IPv4, error) {
	if len(b) < IPv4MinimumSize {
		return nil, ErrTruncated
	}
	if b[0]>>4 != 4 {
		return nil, ErrVersion
	}
	hl := int(b[0]&0xf) * 4
	if hl < IPv4MinimumSize {
		return nil, ErrBadLength
	}
	tl := int(binary.BigEndian.Uint16(b[2:4]))
	if tl < hl {
		return nil, ErrBadLength
	}
	if tl > len(b) {
		return nil, ErrTruncated
	}
	return IPv4(b[:tl]), nil
}

// HeaderLength returns the header length in bytes (IHL * 4).
func (h IPv4) HeaderLength() int { return int(h[0]&0xf) * 4 }

// TOS returns the Type of Service / DSCP+ECN byte.
func (h IPv4) TOS() uint8 { return h[1] }

// TotalLength returns the Total Length field.
func (h IPv4) TotalLength() uint16 { return binary.BigEndian.Uint16(h[2:4]) }

// ID returns the Identification field.
func (h IPv4) ID() uint16 { return binary.BigEndian.Uint16(h[4:6]) }

// Flags returns the three flag bits in their header position (mask with
// IPv4FlagDontFragment / IPv4FlagMoreFragments).
func (h IPv4) Flags() uint16 { return binary.BigEndian.Uint16(h[6:8]) &^ ipv4FragmentOffsetMask }

// FragmentOffset returns the fragment offset in bytes.
func (h IPv4) FragmentOffset() int {
	return int(binary.BigEndian.Uint16(h[6:8])&ipv4FragmentOffsetMask) * 8
}

// MoreFragments reports whether the MF flag is set.
func (h IPv4) MoreFragments() bool { return h.Flags()&IPv4FlagMoreFragments != 0 }

// IsFragment reports whether this packet is any piece of a fragmented
// datagram (MF set or non-zero offset). The translator cannot hand such
// pieces to a socket, so it drops or reassembles them.
func (h IPv4) IsFragment() bool { return h.MoreFragments() || h.FragmentOffset() != 0 }

// TTL returns the Time To Live.
func (h IPv4) TTL() uint8 { return h[8] }

// Protocol returns the upper-layer protocol number.
func (h IPv4) Protocol() IPProtocol { return IPProtocol(h[9]) }

// Checksum returns the header checksum field.
func (h IPv4) Checksum() uint16 { return binary.BigEndian.Uint16(h[10:12]) }

// Source returns the source address.
func (h IPv4) Source() netip.Addr { return netip.AddrFrom4([4]byte(h[12:16])) }

// Destination returns the destination address.
func (h IPv4) Destination() netip.Addr { return netip.AddrFrom4([4]byte(h[16:20])) }

// Options returns the option bytes between the fixed header and the payload.
func (h IPv4) Options() []byte { return h[IPv4MinimumSize:h.HeaderLength()] }

// Payload returns the bytes after the header up to Total Length.
func (h IPv4) Payload() []byte { return h[h.HeaderLength():h.TotalLength()] }

// IsChecksumValid reports whether the header checksum verifies.
func (h IPv4) IsChecksumValid() bool { return Checksum(h[:h.HeaderLength()], 0) == 0xffff }

// SetChecksum recomputes the header checksum.
func (h IPv4) SetChecksum() {
	h[10], h[11] = 0, 0
	binary.BigEndian.PutUint16(h[10:12], ^Checksum(h[:h.HeaderLength()], 0))
}

// SetTTL rewrites the TTL and patches the checksum incrementally.
func (h IPv4) SetTTL(ttl uint8) {
	old := binary.BigEndian.Uint16(h[8:10])
	h[8] = ttl
	binary.BigEndian.PutUint16(h[10:12], ChecksumUpdate(h.Checksum(), old, binary.BigEndian.Uint16(h[8:10])))
}

// NextIPv4Option walks an IPv4 option list (the bytes from Options). It
// returns the first option's type and its data (after the type and length
// bytes), and the remaining list. ok is false at the end of the list
// (End-of-List or no bytes left); err is set when an option's length is
// impossible. Single-byte NOP options are returned with empty data.
func NextIPv4Option(opts []byte) (typ uint8, data, rest []byte, ok bool, err error) {
	if len(opts) == 0 || opts[0] == IPv4OptionEndOfList {
		return 0, nil, nil, false, nil
	}
	if opts[0] == IPv4OptionNOP {
		return IPv4OptionNOP, opts[1:1], opts[1:], true, nil
	}
	if len(opts) < 2 {
		return 0, nil, nil, false, ErrBadOption
	}
	l := int(opts[1])
	if l < 2 || l > len(opts) {
		return 0, nil, nil, false, ErrBadOption
	}
	return opts[0], opts[2:l], opts[l:], true, nil
}

// IPv4Fields holds the values EncodeIPv4 writes. Options, if any, must be a
// multiple of four bytes long.
type IPv4Fields struct {
	TOS            uint8
	TotalLength    uint16 // header + payload
	ID             uint16
	Flags          uint16 // IPv4FlagDontFragment etc. in header position
	FragmentOffset uint16 // in bytes, multiple of 8
	TTL            uint8
	Protocol       IPProtocol
	Source         netip.Addr
	Destination    netip.Addr
	Options        []byte
}

// EncodeIPv4 writes an IPv4 header with a valid checksum into b and returns
// its length, or 0 if b is too short or the options are not a multiple of
// four bytes up to 40.
func EncodeIPv4(b []byte, f *IPv4Fields) int {
	hl := IPv4MinimumSize + len(f.Options)
	if len(f.Options)%4 != 0 || hl > IPv4MaximumSize || len(b) < hl {
		return 0
	}
	b[0] = 0x40 | uint8(hl/4)
	b[1] = f.TOS
	binary.BigEndian.PutUint16(b[2:4], f.TotalLength)
	binary.BigEndian.PutUint16(b[4:6], f.ID)
	binary.BigEndian.PutUint16(b[6:8], f.Flags&^ipv4FragmentOffsetMask|(f.FragmentOffset/8)&ipv4FragmentOffsetMask)
	b[8] = f.TTL
	b[9] = uint8(f.Protocol)
	s, d := as4(f.Source), as4(f.Destination)
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	copy(b[20:hl], f.Options)
	IPv4(b[:hl]).SetChecksum()
	return hl
}

// as4 returns a's four bytes, or zeros when a is not an IPv4 (or
// IPv4-mapped) address; netip.Addr.As4 would panic, and builders must not
// panic on a misconfigured address.
func as4(a netip.Addr) [4]byte {
	if a.Is4() || a.Is4In6() {
		return a.As4()
	}
	return [4]byte{}
}

package header

import (
	"encoding/binary"
	"net/netip"
)

// Sizes of the NDP message bodies (after the 4-byte ICMPv6 type, code and
// checksum), RFC 4861 section 4.
const (
	NDPRouterSolicitMinimumSize   = 4
	NDPRouterAdvertMinimumSize    = 12
	NDPNeighborSolicitMinimumSize = 20
	NDPNeighborAdvertMinimumSize  = 20
	// NDPHopLimit is the hop limit every NDP packet must carry; anything
	// else may have come from off-link and must be ignored.
	NDPHopLimit = 255
)

// NDP option types.
const (
	NDPOptSourceLinkLayer = 1
	NDPOptTargetLinkLayer = 2
	NDPOptPrefixInfo      = 3
	NDPOptRedirected      = 4
	NDPOptMTU             = 5
	NDPOptRDNSS           = 25
	NDPOptDNSSL           = 31
)

// Neighbor Advertisement flags (first byte of the body).
const (
	NDPNAFlagRouter    = 0x80
	NDPNAFlagSolicited = 0x40
	NDPNAFlagOverride  = 0x20
)

// Router Advertisement flags.
const (
	// NDPRAFlagManaged (M): addresses are available through DHCPv6.
	NDPRAFlagManaged = 0x80
	// NDPRAFlagOther (O): other configuration (DNS) through DHCPv6.
	NDPRAFlagOther = 0x40
)

// Prefix Information flags.
const (
	// NDPPrefixFlagOnLink (L): the prefix is on-link.
	NDPPrefixFlagOnLink = 0x80
	// NDPPrefixFlagAutonomous (A): usable for SLAAC.
	NDPPrefixFlagAutonomous = 0x40
)

// NDPInfiniteLifetime is the all-ones lifetime.
const NDPInfiniteLifetime = 0xffffffff

// NDPRouterSolicit is a view of a Router Solicitation body.
type NDPRouterSolicit []byte

// ParseNDPRouterSolicit checks b (ICMPv6.Body) is long enough.
func ParseNDPRouterSolicit(b []byte) (NDPRouterSolicit, error) {
	if len(b) < NDPRouterSolicitMinimumSize {
		return nil, ErrTruncated
	}
	return NDPRouterSolicit(b), nil
}

// Options returns the option list.
func (m NDPRouterSolicit) Options() []byte { return m[NDPRouterSolicitMinimumSize:] }

// NDPRouterAdvert is a view of a Router Advertisement body.
type NDPRouterAdvert []byte

// ParseNDPRouterAdvert checks b (ICMPv6.Body) is long enough.
func ParseNDPRouterAdvert(b []byte) (NDPRouterAdvert, error) {
	if len(b) < NDPRouterAdvertMinimumSize {
		return nil, ErrTruncated
	}
	return NDPRouterAdvert(b), nil
}

// CurHopLimit returns the hop limit hosts should use (0: unspecified).
func (m NDPRouterAdvert) CurHopLimit() uint8 { return m[0] }

// Flags returns the M/O flag byte.
func (m NDPRouterAdvert) Flags() uint8 { return m[1] }

// RouterLifetime returns the default-router lifetime in seconds.
func (m NDPRouterAdvert) RouterLifetime() uint16 { return binary.BigEndian.Uint16(m[2:4]) }

// ReachableTime returns the reachable time in milliseconds.
func (m NDPRouterAdvert) ReachableTime() uint32 { return binary.BigEndian.Uint32(m[4:8]) }

// RetransTimer returns the retransmission timer in milliseconds.
func (m NDPRouterAdvert) RetransTimer() uint32 { return binary.BigEndian.Uint32(m[8:12]) }

// Options returns the option list.
func (m NDPRouterAdvert) Options() []byte { return m[NDPRouterAdvertMinimumSize:] }

// NDPNeighborSolicit is a view of a Neighbor Solicitation body.
type NDPNeighborSolicit []byte

// ParseNDPNeighborSolicit checks b (ICMPv6.Body) is long enough.
func ParseNDPNeighborSolicit(b []byte) (NDPNeighborSolicit, error) {
	if len(b) < NDPNeighborSolicitMinimumSize {
		return nil, ErrTruncated
	}
	return NDPNeighborSolicit(b), nil
}

// Target returns the address being resolved.
func (m NDPNeighborSolicit) Target() netip.Addr { return netip.AddrFrom16([16]byte(m[4:20])) }

// Options returns the option list.
func (m NDPNeighborSolicit) Options() []byte { return m[NDPNeighborSolicitMinimumSize:] }

// NDPNeighborAdvert is a view of a Neighbor Advertisement body.
type NDPNeighborAdvert []byte

// ParseNDPNeighborAdvert checks b (ICMPv6.Body) is long enough.
func ParseNDPNeighborAdvert(b []byte) (NDPNeighborAdvert, error) {
	if len(b) < NDPNeighborAdvertMinimumSize {
		return nil, ErrTruncated
	}
	return NDPNeighborAdvert(b), nil
}

// Flags returns the R/S/O flag byte.
func (m NDPNeighborAdvert) Flags() uint8 { return m[0] }

// Target returns the advertised address.
func (m NDPNeighborAdvert) Target() netip.Addr { return netip.AddrFrom16([16]byte(m[4:20])) }

// Options returns the option list.
func (m NDPNeighborAdvert) Options() []byte { return m[NDPNeighborAdvertMinimumSize:] }

// NextNDPOption walks an NDP option list. It returns the option type, its
// body (everything after the type and length bytes) and the rest. ok is
// false when the list is exhausted; err is ErrBadOption for a zero length
// (which RFC 4861 says must cause the packet to be discarded) or a length
// past the list.
func NextNDPOption(opts []byte) (typ uint8, body, rest []byte, ok bool, err error) {
	if len(opts) == 0 {
		return 0, nil, nil, false, nil
	}
	if len(opts) < 2 {
		return 0, nil, nil, false, ErrBadOption
	}
	l := int(opts[1]) * 8
	if l == 0 || l > len(opts) {
		return 0, nil, nil, false, ErrBadOption
	}
	return opts[0], opts[2:l], opts[l:], true, nil
}

// ValidateNDPOptions reports whether every option in opts is well formed, so
// a caller can discard the packet before acting on any of it.
func ValidateNDPOptions(opts []byte) bool {
	for {
		_, _, rest, ok, err := NextNDPOption(opts)
		if err != nil {
			return false
		}
		if !ok {
			return true
		}
		opts = rest
	}
}

// NDPLinkLayerOption returns the MAC in the first option of type typ
// (NDPOptSourceLinkLayer or NDPOptTargetLinkLayer) in opts.
func NDPLinkLayerOption(opts []byte, typ uint8) (MAC, bool) {
	for {
		t, body, rest, ok, err := NextNDPOption(opts)
		if !ok || err != nil {
			return MAC{}, false
		}
		if t == typ && len(body) >= 6 {
			return MAC(body[0:6]), true
		}
		opts = rest
	}
}

// NDPPrefixInfoSize is the length of a Prefix Information option.
const NDPPrefixInfoSize = 32

// NDPPrefixInfo is a view of a Prefix Information option body (after the
// type and length bytes).
type NDPPrefixInfo []byte

// ParseNDPPrefixInfo checks the body from NextNDPOption is long enough.
func ParseNDPPrefixInfo(body []byte) (NDPPrefixInfo, error) {
	if len(body) < NDPPrefixInfoSize-2 {
		return nil, ErrTruncated
	}
	return NDPPrefixInfo(body), nil
}

// PrefixLength returns the prefix length in bits.
func (p NDPPrefixInfo) PrefixLength() uint8 { return p[0] }

// Flags returns the L/A flag byte.
func (p NDPPrefixInfo) Flags() uint8 { return p[1] }

// ValidLifetime returns the valid lifetime in seconds.
func (p NDPPrefixInfo) ValidLifetime() uint32 { return binary.BigEndian.Uint32(p[2:6]) }

// PreferredLifetime returns the preferred lifetime in seconds.
func (p NDPPrefixInfo) PreferredLifetime() uint32 { return binary.BigEndian.Uint32(p[6:10]) }

// Prefix returns the advertised prefix (masked to its length).
func (p NDPPrefixInfo) Prefix() netip.Prefix {
	pr, err := netip.AddrFrom16([16]byte(p[14:30])).Prefix(int(min(p[0], 128)))
	if err != nil {
		return netip.Prefix{}
	}
	return pr
}

// NDPRouterAdvertFields holds the fixed fields EncodeNDPRouterAdvert writes.
type NDPRouterAdvertFields struct {
	CurHopLimit    uint8
	Flags          uint8
	RouterLifetime uint16
	ReachableTime  uint32
	RetransTimer   uint32
}

// EncodeNDPRouterAdvert writes the ICMPv6 header and fixed body of a Router
// Advertisement (zero checksum) into b and returns 16, or 0 when b is too
// short. Append options, then call ICMPv6.SetChecksum.
func EncodeNDPRouterAdvert(b []byte, f *NDPRouterAdvertFields) int {
	const n = ICMPv6HeaderSize + NDPRouterAdvertMinimumSize
	if len(b) < n {
		return 0
	}
	b[0], b[1], b[2], b[3] = uint8(ICMPv6RouterAdvert), 0, 0, 0
	b[4], b[5] = f.CurHopLimit, f.Flags
	binary.BigEndian.PutUint16(b[6:8], f.RouterLifetime)
	binary.BigEndian.PutUint32(b[8:12], f.ReachableTime)
	binary.BigEndian.PutUint32(b[12:16], f.RetransTimer)
	return n
}

// EncodeNDPRouterSolicit writes a Router Solicitation header (zero
// checksum) into b and returns 8, or 0 when b is too short.
func EncodeNDPRouterSolicit(b []byte) int {
	const n = ICMPv6HeaderSize + NDPRouterSolicitMinimumSize
	if len(b) < n {
		return 0
	}
	clear(b[:n])
	b[0] = uint8(ICMPv6RouterSolicit)
	return n
}

// EncodeNDPNeighborSolicit writes a Neighbor Solicitation for target (zero
// checksum) into b and returns 24, or 0 when b is too short.
func EncodeNDPNeighborSolicit(b []byte, target netip.Addr) int {
	return encodeNDPNeighbor(b, ICMPv6NeighborSolicit, 0, target)
}

// EncodeNDPNeighborAdvert writes a Neighbor Advertisement for target with
// flags (NDPNAFlag*) (zero checksum) into b and returns 24, or 0 when b is
// too short.
func EncodeNDPNeighborAdvert(b []byte, flags uint8, target netip.Addr) int {
	return encodeNDPNeighbor(b, ICMPv6NeighborAdvert, flags, target)
}

func encodeNDPNeighbor(b []byte, t ICMPv6Type, flags uint8, target netip.Addr) int {
	const n = ICMPv6HeaderSize + NDPNeighborSolicitMinimumSize
	if len(b) < n {
		return 0
	}
	clear(b[:8])
	b[0], b[4] = uint8(t), flags
	a := target.As16()
	copy(b[8:24], a[:])
	return n
}

// EncodeNDPLinkLayerOption writes a source or target link-layer address
// option and returns 8, or 0 when b is too short.
func EncodeNDPLinkLayerOption(b []byte, typ uint8, mac MAC) int {
	if len(b) < 8 {
		return 0
	}
	b[0], b[1] = typ, 1
	copy(b[2:8], mac[:])
	return 8
}

// EncodeNDPPrefixInfo writes a Prefix Information option and returns 32, or
// 0 when b is too short.
func EncodeNDPPrefixInfo(b []byte, prefix netip.Prefix, flags uint8, valid, preferred uint32) int {
	if len(b) < NDPPrefixInfoSize {
		return 0
	}
	b[0], b[1], b[2], b[3] = NDPOptPrefixInfo, 4, uint8(prefix.Bits()), flags
	binary.BigEndian.PutUint32(b[4:8], valid)
	binary.BigEndian.PutUint32(b[8:12], preferred)
	clear(b[12:16])
	a := prefix.Masked().Addr().As16()
	copy(b[16:32], a[:])
	return NDPPrefixInfoSize
}

// EncodeNDPMTU writes an MTU option and returns 8, or 0 when b is too short.
func EncodeNDPMTU(b []byte, mtu uint32) int {
	if len(b) < 8 {
		return 0
	}
	b[0], b[1], b[2], b[3] = NDPOptMTU, 1, 0, 0
	binary.BigEndian.PutUint32(b[4:8], mtu)
	return 8
}

// EncodeNDPRDNSS writes a Recursive DNS Server option (RFC 8106) with the
// IPv6 addresses in addrs and returns its length, or 0 when there are none
// or b is too short.
func EncodeNDPRDNSS(b []byte, lifetime uint32, addrs ...netip.Addr) int {
	k := 0
	for _, a := range addrs {
		if a.Is6() && !a.Is4In6() {
			k++
		}
	}
	n := 8 + 16*k
	if k == 0 || len(b) < n || n/8 > 255 {
		return 0
	}
	b[0], b[1], b[2], b[3] = NDPOptRDNSS, uint8(n/8), 0, 0
	binary.BigEndian.PutUint32(b[4:8], lifetime)
	off := 8
	for _, a := range addrs {
		if a.Is6() && !a.Is4In6() {
			v := a.As16()
			off += copy(b[off:], v[:])
		}
	}
	return n
}

// EncodeNDPDNSSL writes a DNS Search List option (RFC 8106) with names in
// uncompressed encoding, zero-padded to a multiple of 8, and returns its
// length, or 0 when no name is valid or b is too short.
func EncodeNDPDNSSL(b []byte, lifetime uint32, names []string) int {
	k := 0
	for _, name := range names {
		if l := DomainNameEncodedLen(name); l > 1 {
			k += l
		}
	}
	n := (8 + k + 7) &^ 7
	if k == 0 || len(b) < n || n/8 > 255 {
		return 0
	}
	b[0], b[1], b[2], b[3] = NDPOptDNSSL, uint8(n/8), 0, 0
	binary.BigEndian.PutUint32(b[4:8], lifetime)
	off := 8
	for _, name := range names {
		if DomainNameEncodedLen(name) > 1 {
			off += EncodeDomainName(b[off:], name)
		}
	}
	clear(b[off:n])
	return n
}

package header

import "errors"

// Sentinel errors returned by the parsers. They are package variables so that
// rejecting a hostile frame costs no allocation; callers compare with
// errors.Is and count the reason.
var (
	// ErrTruncated means the buffer is shorter than the header or than a
	// length field inside it claims.
	ErrTruncated = errors.New("truncated")
	// ErrVLAN means the Ethernet frame carries an 802.1Q/802.1ad tag, which
	// the guest link never uses.
	ErrVLAN = errors.New("vlan tagged frame")
	// ErrVersion means an IP header's version field does not match its
	// EtherType.
	ErrVersion = errors.New("bad ip version")
	// ErrBadLength means a length field is inconsistent (too small for the
	// header it describes, or zero where zero would loop forever).
	ErrBadLength = errors.New("bad length field")
	// ErrBadOption means an option list is malformed.
	ErrBadOption = errors.New("malformed option")
	// ErrTooManyHeaders means an IPv6 extension-header chain is longer than
	// the walker's bound.
	ErrTooManyHeaders = errors.New("too many ipv6 extension headers")
	// ErrNotSupported means the bytes are well formed but describe a variant
	// this package does not handle (for example a non-Ethernet ARP).
	ErrNotSupported = errors.New("unsupported variant")
	// ErrBadMagic means a DHCPv4 message lacks the magic cookie.
	ErrBadMagic = errors.New("missing dhcp magic cookie")
)

package header

import "encoding/binary"

// MAC is an IEEE 802 48-bit hardware address. It is an array, not a slice,
// so it compares with == and passes by value without allocating.
type MAC [6]byte

// BroadcastMAC is the all-ones Ethernet destination.
var BroadcastMAC = MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// IsMulticast reports whether the group bit is set (this includes broadcast).
func (m MAC) IsMulticast() bool { return m[0]&1 != 0 }

// IsBroadcast reports whether m is ff:ff:ff:ff:ff:ff.
func (m MAC) IsBroadcast() bool { return m == BroadcastMAC }

// IsZero reports whether m is 00:00:00:00:00:00, the "unknown" address.
func (m MAC) IsZero() bool { return m == MAC{} }

// String formats m as six colon-separated hex bytes.
func (m MAC) String() string {
	const hexDigits = "0123456789abcdef"
	var b [17]byte
	for i, v := range m {
		if i > 0 {
			b[i*3-1] = ':'
		}
		b[i*3] = hexDigits[v>>4]
		b[i*3+1] = hexDigits[v&0xf]
	}
	return string(b[:])
}

// IPv6MulticastMAC returns the Ethernet address an IPv6 multicast group maps
// to (RFC 2464 section 7): 33:33 followed by the group's last four bytes.
func IPv6MulticastMAC(group [16]byte) MAC {
	return MAC{0x33, 0x33, group[12], group[13], group[14], group[15]}
}

// EtherType is the 16-bit protocol identifier of an Ethernet II frame.
type EtherType uint16

// EtherTypes this package recognises.
const (
	EtherTypeIPv4 EtherType = 0x0800
	EtherTypeARP  EtherType = 0x0806
	EtherTypeRARP EtherType = 0x8035
	EtherTypeIPv6 EtherType = 0x86dd
	// EtherTypeVLAN is the 802.1Q customer tag.
	EtherTypeVLAN EtherType = 0x8100
	// EtherTypeQinQ is the 802.1ad service tag.
	EtherTypeQinQ EtherType = 0x88a8
	// EtherTypeQinQOld is the pre-standard double-tag value still emitted by
	// some switches.
	EtherTypeQinQOld EtherType = 0x9100
)

// EthernetMinimumSize is the length of an untagged Ethernet II header.
const EthernetMinimumSize = 14

// Ethernet is a view of an untagged Ethernet II frame, header first.
type Ethernet []byte

// ParseEthernet checks that frame holds a full untagged Ethernet II header
// and returns it as a view. VLAN-tagged frames are rejected with ErrVLAN: the
// virtio link is a single untagged segment, so a tag means a confused or
// hostile guest. Frames using 802.3 length fields (type below 0x0600) are
// rejected with ErrNotSupported.
func ParseEthernet(frame []byte) (Ethernet, error) {
	if len(frame) < EthernetMinimumSize {
		return nil, ErrTruncated
	}
	e := Ethernet(frame)
	switch t := e.Type(); {
	case t == EtherTypeVLAN || t == EtherTypeQinQ || t == EtherTypeQinQOld:
		return nil, ErrVLAN
	case t < 0x0600:
		return nil, ErrNotSupported
	}
	return e, nil
}

// Destination returns the destination hardware address.
func (e Ethernet) Destination() MAC { return MAC(e[0:6]) }

// Source returns the source hardware address.
func (e Ethernet) Source() MAC { return MAC(e[6:12]) }

// Type returns the EtherType.
func (e Ethernet) Type() EtherType { return EtherType(binary.BigEndian.Uint16(e[12:14])) }

// Payload returns the bytes after the header (may include Ethernet padding;
// the network-layer parser trims it using its own length field).
func (e Ethernet) Payload() []byte { return e[EthernetMinimumSize:] }

// SetDestination overwrites the destination address.
func (e Ethernet) SetDestination(m MAC) { copy(e[0:6], m[:]) }

// SetSource overwrites the source address.
func (e Ethernet) SetSource(m MAC) { copy(e[6:12], m[:]) }

// EncodeEthernet writes an Ethernet II header into b and returns the header
// length, or 0 when b is too short.
func EncodeEthernet(b []byte, dst, src MAC, t EtherType) int {
	if len(b) < EthernetMinimumSize {
		return 0
	}
	copy(b[0:6], dst[:])
	copy(b[6:12], src[:])
	binary.BigEndian.PutUint16(b[12:14], uint16(t))
	return EthernetMinimumSize
}

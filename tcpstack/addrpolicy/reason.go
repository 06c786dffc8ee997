package addrpolicy

// Reason says why the policy refused a packet; None means it did not.
type Reason uint8

// Reasons. Metrics export them by [Reason.String]; keep the names stable.
const (
	// None: allowed.
	None Reason = iota
	// DstLoopback: to 127.0.0.0/8 or ::1, in any spelling
	// (::ffff:127.x.y.z, ::127.x.y.z).
	DstLoopback
	// DstUnspecified: to 0.0.0.0/8 or ::, in any spelling.
	DstUnspecified
	// DstV4Mapped: to another IPv4-mapped (::ffff:0:0/96) or
	// IPv4-compatible (::/96) IPv6 address.
	DstV4Mapped
	// DstMulticast: to a multicast address no service of ours answers.
	DstMulticast
	// DstBroadcast: to 255.255.255.255 or the guest prefix's broadcast.
	DstBroadcast
	// DstLinkLocal: to an IPv6 link-local address that is not the
	// gateway's mapping (the host has no socket on the guest's link).
	DstLinkLocal
	// SrcLoopback: from a loopback address, in any spelling.
	SrcLoopback
	// SrcUnspecified: from 0.0.0.0/8 or :: (outside DHCP, DHCPv6, NDP).
	SrcUnspecified
	// SrcMulticast: from a multicast or broadcast address.
	SrcMulticast
	// SrcNotGuest: from an address that is not the guest's.
	SrcNotGuest
	// NumReasons is the number of reasons, None included (array size).
	NumReasons
)

var reasonNames = [NumReasons]string{
	None:           "none",
	DstLoopback:    "dst_loopback",
	DstUnspecified: "dst_unspecified",
	DstV4Mapped:    "dst_v4_mapped",
	DstMulticast:   "dst_multicast",
	DstBroadcast:   "dst_broadcast",
	DstLinkLocal:   "dst_link_local",
	SrcLoopback:    "src_loopback",
	SrcUnspecified: "src_unspecified",
	SrcMulticast:   "src_multicast",
	SrcNotGuest:    "src_not_guest",
}

// String returns the metric label value of the reason.
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Routine reports whether guests send such packets in normal operation
// (multicast and broadcast chatter: mDNS, SSDP, LLMNR...), so a refusal is
// worth a debug line rather than a warning.
func (r Reason) Routine() bool { return r == DstMulticast || r == DstBroadcast }

package stats

// DropReason says why a frame was discarded instead of being translated or
// delivered. The values index [Dir.Drops].
type DropReason uint8

// Drop reasons. Metrics export them by [DropReason.String]; keep names stable.
const (
	// DropRunt: a TX chain shorter than the virtio-net header plus an Ethernet header.
	DropRunt DropReason = iota
	// DropUnknownEtherType: an ethertype the stack does not translate.
	DropUnknownEtherType
	// DropUnhandledProtocol: IPv4/IPv6 traffic of a kind not translated (yet).
	DropUnhandledProtocol
	// DropRingDisabled: TX frame on a disabled ring, or an RX frame while the
	// RX ring is disabled (the vhost-user spec says discard, do not queue).
	DropRingDisabled
	// DropOversize: a frame for a link service larger than the copy buffer.
	DropOversize
	// DropNoFit: an RX frame larger than one guest buffer chain while
	// VIRTIO_NET_F_MRG_RXBUF is not negotiated, or larger than any reservation.
	DropNoFit
	// DropPendingOverflow: a ring of frames waiting for guest RX buffers
	// was full: the oldest link-service reply went, a stateless TCP reset
	// was not queued, or one receive handed over more UDP datagrams than
	// the list of those waiting holds.
	DropPendingOverflow
	// DropBadRXChain: an RX chain with no device-writable buffer.
	DropBadRXChain
	// DropQueueBroken: the ring was marked broken by virtqueue; frames are lost.
	DropQueueBroken
	// DropMalformed: a frame whose headers do not parse.
	DropMalformed
	// DropSendError: the host socket refused the payload.
	DropSendError
	// DropNoFlow: no flow could be created (table full, socket error).
	DropNoFlow
	// DropProtocolDisabled: guest TCP, UDP or ICMP echo while disabled by
	// Config.NoTCP, NoUDP or NoICMP.
	DropProtocolDisabled
	// DropFragment: an IP fragment (or a partly reassembled datagram)
	// given up: overlapping, invalid, timed out, evicted, or not
	// reassembled (TCP); see Proto.Fragments.
	DropFragment
	// DropPolicy: a guest packet the address policy refused (see
	// Queue.PolicyDrops for the reason).
	DropPolicy
	// DropUnanswered: a frame for a link service (ARP, DHCP, DHCPv6, NDP)
	// that asks nothing it answers: an announcement, a duplicate-address
	// probe, another server's transaction, a malformed request, or a
	// service or address family that is off.
	DropUnanswered
	// DropFlowMoving: a guest frame whose flow another queue pair held
	// and did not hand over in time (that pair stopped, or the frame came
	// from a reassembled datagram, which cannot wait).
	DropFlowMoving
	// DropFlowClosed: datagrams received from a flow's socket that waited
	// for guest RX buffers while the flow was closed (idle, evicted, or
	// handed to another queue pair).
	DropFlowClosed

	// NumDropReasons is the number of drop reasons (array size).
	NumDropReasons
)

var dropReasonNames = [NumDropReasons]string{
	DropRunt:              "runt",
	DropUnknownEtherType:  "unknown_ethertype",
	DropUnhandledProtocol: "unhandled_protocol",
	DropRingDisabled:      "ring_disabled",
	DropOversize:          "oversize",
	DropNoFit:             "no_fit",
	DropPendingOverflow:   "pending_overflow",
	DropBadRXChain:        "bad_rx_chain",
	DropQueueBroken:       "queue_broken",
	DropMalformed:         "malformed",
	DropSendError:         "send_error",
	DropNoFlow:            "no_flow",
	DropProtocolDisabled:  "protocol_disabled",
	DropFragment:          "fragment",
	DropPolicy:            "policy",
	DropUnanswered:        "unanswered",
	DropFlowMoving:        "flow_moving",
	DropFlowClosed:        "flow_closed",
}

// String returns the metric label value for the reason.
func (r DropReason) String() string { return label(dropReasonNames[:], r) }

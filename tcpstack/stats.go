package tcpstack

import (
	"sync/atomic"

	"vunet/tcpstack/addrpolicy"
)

// DropReason says why a frame was discarded instead of being translated or
// delivered. The values index [DirStats.Drops].
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
	// DropPendingOverflow: the pending reply ring was full; the oldest reply went.
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
	// reassembled (TCP); see ProtoStats.Fragments.
	DropFragment
	// DropPolicy: a guest packet the address policy refused (see
	// QueueStats.PolicyDrops for the reason).
	DropPolicy

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
}

// String returns the metric label value for the reason.
func (r DropReason) String() string {
	if r < NumDropReasons {
		return dropReasonNames[r]
	}
	return "unknown"
}

// EtherClass groups TX frames by ethertype for [QueueStats.TXByEtherType].
type EtherClass uint8

// Ethertype classes.
const (
	EtherARP EtherClass = iota
	EtherIPv4
	EtherIPv6
	EtherOther
	// NumEtherClasses is the number of classes (array size).
	NumEtherClasses
)

var etherClassNames = [NumEtherClasses]string{"arp", "ipv4", "ipv6", "other"}

// String returns the metric label value for the class.
func (c EtherClass) String() string {
	if c < NumEtherClasses {
		return etherClassNames[c]
	}
	return "unknown"
}

// Service identifies a link service that answers guest frames itself.
type Service uint8

// Link services.
const (
	SvcARP Service = iota
	SvcDHCP
	SvcDHCPv6
	SvcNDP
	SvcICMPEcho
	// NumServices is the number of services (array size).
	NumServices
)

var serviceNames = [NumServices]string{"arp", "dhcp", "dhcpv6", "ndp", "icmp_echo"}

// String returns the metric label value for the service.
func (s Service) String() string {
	if s < NumServices {
		return serviceNames[s]
	}
	return "unknown"
}

// DirStats counts one direction of a queue pair. All fields are atomics so
// metrics can read them at scrape time while the loop writes them.
type DirStats struct {
	Frames  atomic.Uint64 // frames handled (TX: popped; RX: placed in used descriptors)
	Bytes   atomic.Uint64 // Ethernet bytes of those frames, virtio-net header excluded
	Batches atomic.Uint64 // used-ring publications (one Flush each)
	Drops   [NumDropReasons]atomic.Uint64
}

// QueueStats holds the data-path counters of one queue pair. They survive
// StopPair/StartPair cycles of the same pair index, so rates stay continuous
// across the control plane's ring rebuilds.
type QueueStats struct {
	TX DirStats
	RX DirStats
	// TXByEtherType counts TX frames by ethertype class.
	TXByEtherType [NumEtherClasses]atomic.Uint64
	// RXWaitedForDescriptors counts waits for a refill of the guest's RX
	// ring: each link-service reply that found it empty (once per reply),
	// and each TCP output pass that ran out of descriptors with frames due
	// (once per wait, however often it is retried before buffers come).
	RXWaitedForDescriptors atomic.Uint64
	// RXChainsWasted counts RX chains returned to the guest empty because
	// they could be neither used nor rewound (a reservation committed short
	// with another one behind it, or chains popped before a bad chain).
	RXChainsWasted atomic.Uint64
	// ServiceReplies counts frames produced by each link service. The link
	// announcements of a pair start count when they reach the guest (or
	// are dropped), not when queued: one discarded with a pair stopped
	// before the guest posted RX buffers is made again at the next start.
	ServiceReplies [NumServices]atomic.Uint64
	// Wakeups counts event-loop returns from epoll_wait.
	Wakeups atomic.Uint64
	// LoopStarts counts how many times the pair's loop was started.
	LoopStarts atomic.Uint64
	// FlowsOpened and FlowsClosed count host-socket flows (UDP, ICMP echo).
	FlowsOpened, FlowsClosed atomic.Uint64
	// FlowsEvicted counts flows closed early to make room in a full table.
	FlowsEvicted atomic.Uint64
	// Proto counts UDP, ICMP and link-service events.
	Proto ProtoStats
	// MemoryFaults counts event loops stopped by a fault on guest memory
	// (the front-end shrank or unmapped the file behind a region). The
	// pair stays inert until the control plane stops and rebuilds it.
	MemoryFaults atomic.Uint64
	// PolicyDrops counts guest packets the address policy refused, by
	// protocol and reason (each is also a TX drop, DropPolicy).
	PolicyDrops [addrpolicy.NumProtos][addrpolicy.NumReasons]atomic.Uint64
}

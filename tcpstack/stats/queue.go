package stats

import (
	"sync/atomic"

	"vunet/tcpstack/addrpolicy"
)

// EtherClass groups TX frames by ethertype for [Queue.TXByEtherType].
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
func (c EtherClass) String() string { return label(etherClassNames[:], c) }

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
func (s Service) String() string { return label(serviceNames[:], s) }

// Dir counts one direction of a queue pair. All fields are atomics so
// metrics can read them at scrape time while the loop writes them.
type Dir struct {
	Frames  atomic.Uint64 // frames handled (TX: popped; RX: placed in used descriptors)
	Bytes   atomic.Uint64 // Ethernet bytes of those frames, virtio-net header excluded
	Batches atomic.Uint64 // used-ring publications (one Flush each)
	Drops   [NumDropReasons]atomic.Uint64
}

// Queue holds the data-path counters of one queue pair. They survive
// StopPair/StartPair cycles of the same pair index, so rates stay continuous
// across the control plane's ring rebuilds.
type Queue struct {
	TX Dir
	RX Dir
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
	// PollHits and PollMisses count the event loop's bounded busy-polls
	// before a sleep: those that found an event, and those that ran out
	// and slept.
	PollHits, PollMisses atomic.Uint64
	// LoopStarts counts how many times the pair's loop was started.
	LoopStarts atomic.Uint64
	// Flows counts the pair's flows by protocol (TCP, UDP, ICMP echo):
	// live, capacity, opened, closed, evicted.
	Flows Flows
	// FlowFetches counts guest frames whose flow (TCP, UDP, ICMP echo)
	// another queue pair held: the frame waited while the flow came here.
	// FlowFetchMisses counts fetches the other pair could not serve (the
	// flow had gone meanwhile); the frame was then handled as one of an
	// unknown flow.
	FlowFetches, FlowFetchMisses atomic.Uint64
	// Proto counts UDP, ICMP and link-service events.
	Proto Proto
	// MemoryFaults counts event loops stopped by a fault on guest memory
	// (the front-end shrank or unmapped the file behind a region). The
	// pair stays inert until the control plane stops and rebuilds it.
	MemoryFaults atomic.Uint64
	// PolicyDrops counts guest packets the address policy refused, by
	// protocol and reason (each is also a TX drop, DropPolicy).
	PolicyDrops [addrpolicy.NumProtos][addrpolicy.NumReasons]atomic.Uint64
	// Stream counts the stream transport's socket (pair 0 only, when it
	// serves -netdev stream instead of vhost-user).
	Stream Stream
}

// UDPDrop counts a dropped UDP datagram in both the direction's drops and
// the UDP ones.
func (st *Queue) UDPDrop(d FlowDir, r DropReason) { st.UDPDropN(d, r, 1) }

// UDPDropN is UDPDrop for n datagrams dropped together (a coalesced run).
func (st *Queue) UDPDropN(d FlowDir, r DropReason, n int) {
	if d == ToGuest {
		st.RX.Drops[r].Add(uint64(n))
	} else {
		st.TX.Drops[r].Add(uint64(n))
	}
	st.Proto.UDPDrops[d][r].Add(uint64(n))
}

// label is the metric label value names gives v, "unknown" out of range.
func label[T ~uint8](names []string, v T) string {
	if int(v) < len(names) {
		return names[v]
	}
	return "unknown"
}

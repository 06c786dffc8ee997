package stats

import "sync/atomic"

// FlowProto is the protocol of a flow, the protocol label of the flow
// counters ([Flows]) and of the forward counters ([Forwards]).
type FlowProto uint8

// Flow protocols.
const (
	FlowTCP FlowProto = iota
	FlowUDP
	FlowICMP // ICMP and ICMPv6 echo
	// NumFlowProtos is the number of protocols (array size).
	NumFlowProtos
)

var flowProtoNames = [NumFlowProtos]string{"tcp", "udp", "icmp"}

// String returns the metric label value of the protocol.
func (p FlowProto) String() string { return label(flowProtoNames[:], p) }

// Flows counts a queue pair's flows by protocol: TCP connections (each a
// connected or accepted host socket), UDP flows and ICMP echo flows (each
// a connected datagram or ping socket). The tables keep them; metrics
// reads them at scrape time.
type Flows struct {
	// Live is the number of flows in the tables (gauges): for TCP every
	// state but free, for UDP and ICMP every open flow.
	Live [NumFlowProtos]atomic.Int64
	// Capacity is how many flows of the protocol the tables can hold
	// (gauges). UDP and ICMP share the datagram table: each may fill the
	// guest's share of it alone, so their capacities overlap; UDP's
	// includes the slots kept for peers of forwarded UDP ports where the
	// pair has such ports.
	Capacity [NumFlowProtos]atomic.Int64
	// Opened and Closed count flows opened for the guest or a forwarded
	// port's peer, and closed. Evicted counts flows closed early to make
	// room (also in Closed); TCP never evicts.
	Opened, Closed, Evicted [NumFlowProtos]atomic.Uint64
	// MovedIn and MovedOut count flows taken over from, and handed to,
	// another queue pair (the guest sent their frames on another TX
	// queue) or, in a live migration, another vunet. Per pair and
	// protocol, Opened + MovedIn - Closed - MovedOut is Live.
	MovedIn, MovedOut [NumFlowProtos]atomic.Uint64
}

// Forwards counts a Stack's forwarded host ports (passt's -t and -u), by
// protocol (FlowTCP, FlowUDP): those opened at start-up and those added
// and removed at run time alike.
type Forwards struct {
	// Ports is the number of forwarded ports open (gauges), one listening
	// socket each (a port forwarded on both address families is two).
	Ports [NumFlowProtos]atomic.Int64
	// BindFailures counts forwarded ports that could not be opened: in
	// use, not permitted, or skipped by the best-effort rule of "all" and
	// exclusion-only specifications.
	BindFailures [NumFlowProtos]atomic.Uint64
}

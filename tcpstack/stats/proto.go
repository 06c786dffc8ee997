package stats

import "sync/atomic"

// FlowDir is a direction of translated traffic for [Proto].
type FlowDir uint8

// Directions.
const (
	ToGuest FlowDir = iota
	FromGuest
	// NumFlowDirs is the number of directions (array size).
	NumFlowDirs
)

var flowDirNames = [NumFlowDirs]string{"to_guest", "from_guest"}

// String returns the metric label value for the direction.
func (d FlowDir) String() string { return label(flowDirNames[:], d) }

// Proto counts UDP and ICMP translation and what the link services
// handed out. All fields are atomics, written by the pair's loop and read
// by metrics at scrape time.
type Proto struct {
	// UDPDatagrams and UDPBytes (payload) count datagrams translated, by
	// direction.
	UDPDatagrams, UDPBytes [NumFlowDirs]atomic.Uint64
	// UDPUSOFrames counts frames of several datagrams (USO, GSO_UDP_L4):
	// to the guest, runs UDP_GRO had coalesced (VIRTIO_NET_F_GUEST_USO4/6);
	// from it, its own (VIRTIO_NET_F_HOST_USO).
	UDPUSOFrames [NumFlowDirs]atomic.Uint64
	// UDPDrops counts UDP datagrams dropped, by direction and reason (they
	// are counted in Dir.Drops as well).
	UDPDrops [NumFlowDirs][NumDropReasons]atomic.Uint64
	// DNSForwardDatagrams counts guest UDP datagrams sent to the DNS
	// forward (--dns-forward: the gateway's port 53 goes to a resolver):
	// one per query.
	DNSForwardDatagrams atomic.Uint64
	// ICMPEchoRequests counts guest echo requests sent out of a ping
	// socket; ICMPEchoReplies the replies delivered to the guest.
	ICMPEchoRequests, ICMPEchoReplies atomic.Uint64
	// DHCPLeases and DHCPv6Leases count DHCPACKs with an address and
	// DHCPv6 REPLYs with an IA address sent to the guest.
	DHCPLeases, DHCPv6Leases atomic.Uint64
	// RouterAdverts and NeighborAdverts count NDP messages sent (solicited
	// and unsolicited router advertisements, neighbor advertisements).
	RouterAdverts, NeighborAdverts atomic.Uint64
	// Fragments counts IP fragments from the guest by outcome.
	Fragments [NumFragOutcomes]atomic.Uint64
}

// FragOutcome classifies IP fragments from the guest for
// [Proto.Fragments].
type FragOutcome uint8

// Fragment outcomes.
const (
	// FragReceived: a fragment was taken into a reassembly buffer.
	FragReceived FragOutcome = iota
	// FragReassembled: a datagram was completed and translated.
	FragReassembled
	// FragOverlap: a fragment overlapped (or repeated) one already held;
	// the datagram was discarded.
	FragOverlap
	// FragInvalid: inconsistent lengths, or a datagram over 65535 bytes.
	FragInvalid
	// FragTimeout: a datagram not completed within 30 seconds.
	FragTimeout
	// FragEvicted: a datagram whose buffer a newer one took (pool full).
	FragEvicted
	// FragUnsupported: a TCP fragment, or an IPv6 fragment behind other
	// extension headers.
	FragUnsupported
	// NumFragOutcomes is the number of outcomes (array size).
	NumFragOutcomes
)

var fragOutcomeNames = [NumFragOutcomes]string{"received", "reassembled", "overlap", "invalid", "timeout", "evicted", "unsupported"}

// String returns the metric label value for the outcome.
func (o FragOutcome) String() string { return label(fragOutcomeNames[:], o) }

package tcpstack

import (
	"sync/atomic"

	"vunet/tcpstack/linksvc"
)

// FlowDir is a direction of translated traffic for [ProtoStats].
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
func (d FlowDir) String() string {
	if d < NumFlowDirs {
		return flowDirNames[d]
	}
	return "unknown"
}

// ProtoStats counts UDP and ICMP translation and what the link services
// handed out. All fields are atomics, written by the pair's loop and read
// by metrics at scrape time.
type ProtoStats struct {
	// UDPFlows and ICMPFlows are the live flows (gauges).
	UDPFlows, ICMPFlows atomic.Int64
	// UDPDatagrams and UDPBytes (payload) count datagrams translated, by
	// direction.
	UDPDatagrams, UDPBytes [NumFlowDirs]atomic.Uint64
	// UDPDrops counts UDP datagrams dropped, by direction and reason (they
	// are counted in DirStats.Drops as well).
	UDPDrops [NumFlowDirs][NumDropReasons]atomic.Uint64
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

// udpDrop counts a dropped UDP datagram in both the direction's drops and
// the UDP ones.
func (st *QueueStats) udpDrop(d FlowDir, r DropReason) {
	if d == ToGuest {
		st.RX.Drops[r].Add(1)
	} else {
		st.TX.Drops[r].Add(1)
	}
	st.Proto.UDPDrops[d][r].Add(1)
}

// countServiceReply counts a link-service reply by what the service says
// it built.
func (st *QueueStats) countServiceReply(svc Service, r linksvc.Reply) {
	switch {
	case svc == SvcDHCP && r == linksvc.ReplyLease:
		st.Proto.DHCPLeases.Add(1)
	case svc == SvcDHCPv6 && r == linksvc.ReplyLease:
		st.Proto.DHCPv6Leases.Add(1)
	case r == linksvc.ReplyRouterAdvert:
		st.Proto.RouterAdverts.Add(1)
	case r == linksvc.ReplyNeighborAdvert:
		st.Proto.NeighborAdverts.Add(1)
	}
}

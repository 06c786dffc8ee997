package tcpstack

import (
	"encoding/binary"
	"sync/atomic"
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

// countServiceReply classifies a link-service reply frame (Ethernet
// onward) for the lease and NDP counters. Only replies are parsed, and
// only a few bytes of them.
func (st *QueueStats) countServiceReply(svc Service, f []byte) {
	switch svc {
	case SvcDHCP:
		// Ethernet, IPv4 without options (the service builds it), UDP,
		// then BOOTP: yiaddr at 16, options after the 240-byte header.
		const bootp = ethHdrLen + ipv4HdrLen + udpHdrLen
		if len(f) < bootp+240 || binary.BigEndian.Uint32(f[bootp+16:]) == 0 {
			return
		}
		if dhcpMessageType(f[bootp+240:]) == 5 { // DHCPACK
			st.Proto.DHCPLeases.Add(1)
		}
	case SvcDHCPv6:
		const msg = ethHdrLen + ipv6HdrLen + udpHdrLen
		if len(f) < msg+4 || f[msg] != 7 { // REPLY
			return
		}
		if dhcpv6HasIAAddr(f[msg+4:]) {
			st.Proto.DHCPv6Leases.Add(1)
		}
	case SvcNDP:
		if len(f) < ethHdrLen+ipv6HdrLen+1 || f[ethHdrLen+6] != ipProtoICMPv6 {
			return
		}
		switch f[ethHdrLen+ipv6HdrLen] {
		case 134:
			st.Proto.RouterAdverts.Add(1)
		case 136:
			st.Proto.NeighborAdverts.Add(1)
		}
	}
}

// dhcpMessageType finds option 53 in DHCP options; 0 when absent.
func dhcpMessageType(opts []byte) uint8 {
	for len(opts) > 0 {
		code := opts[0]
		switch code {
		case 0:
			opts = opts[1:]
			continue
		case 255:
			return 0
		}
		if len(opts) < 2 || len(opts) < 2+int(opts[1]) {
			return 0
		}
		if code == 53 && opts[1] == 1 {
			return opts[2]
		}
		opts = opts[2+int(opts[1]):]
	}
	return 0
}

// dhcpv6HasIAAddr reports whether DHCPv6 options hold an IA_NA (3) with an
// IAADDR (5) inside.
func dhcpv6HasIAAddr(opts []byte) bool {
	for len(opts) >= 4 {
		code, n := binary.BigEndian.Uint16(opts), int(binary.BigEndian.Uint16(opts[2:]))
		if len(opts) < 4+n {
			return false
		}
		if code == 3 && n >= 12 {
			sub := opts[4+12 : 4+n]
			for len(sub) >= 4 {
				sc, sn := binary.BigEndian.Uint16(sub), int(binary.BigEndian.Uint16(sub[2:]))
				if len(sub) < 4+sn {
					break
				}
				if sc == 5 && sn >= 24 {
					return true
				}
				sub = sub[4+sn:]
			}
		}
		opts = opts[4+n:]
	}
	return false
}

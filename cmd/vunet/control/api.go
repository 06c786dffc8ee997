package control

import (
	"net"
	"net/netip"

	"vunet/tcpstack"
	"vunet/tcpstack/stats"
)

// The API's JSON documents. Field names are part of the API: keep them.

// Forward is one forwarded host port: one listening socket (a port
// forwarded on every address of both families is two).
type Forward struct {
	ID        uint64 `json:"id"`
	Protocol  string `json:"protocol"` // tcp or udp
	Address   string `json:"address"`  // bind address; 0.0.0.0 and :: are every address of the family
	HostPort  uint16 `json:"host_port"`
	GuestPort uint16 `json:"guest_port"`
	Interface string `json:"interface,omitempty"`
}

// Forwards is the answer of a listing, an addition or a removal.
type Forwards struct {
	Forwards []Forward `json:"forwards"`
}

// ForwardRequest asks to add or remove forwards: a protocol and a spec in
// passt's -t/-u syntax.
type ForwardRequest struct {
	Protocol string `json:"protocol"`
	Spec     string `json:"spec"`
}

// Status is the read-only status.
type Status struct {
	Guest  GuestStatus `json:"guest"`
	Queues QueueStatus `json:"queues"`
	// Flows counts the live flows of every queue pair by protocol (tcp,
	// udp, icmp).
	Flows map[string]int64 `json:"flows"`
	// Forwards counts the forwarded ports open by protocol (tcp, udp).
	Forwards map[string]int `json:"forwards"`
}

// GuestStatus is what vunet knows of the guest.
type GuestStatus struct {
	// MAC is learned from the guest's frames, announced or configured;
	// empty while unknown.
	MAC string `json:"mac,omitempty"`
	// IPv4 and IPv6 are the addresses the guest is offered (DHCP,
	// DHCPv6); empty for a family that is off or has none.
	IPv4 string `json:"ipv4,omitempty"`
	IPv6 string `json:"ipv6,omitempty"`
	// DHCPLeases and DHCPv6Leases count the address-carrying answers the
	// guest was sent (DHCPACK, DHCPv6 REPLY): it took the offer.
	DHCPLeases   uint64 `json:"dhcp_leases"`
	DHCPv6Leases uint64 `json:"dhcpv6_leases"`
	// Seen are the guest's addresses as its own TCP segments gave them.
	Seen []string `json:"seen"`
}

// QueueStatus is the queue pairs: how many were offered to the front-end,
// and each that has run.
type QueueStatus struct {
	Offered int          `json:"offered"`
	Pairs   []PairStatus `json:"pairs"`
}

// PairStatus is one queue pair.
type PairStatus struct {
	Index   int  `json:"index"`
	Running bool `json:"running"`
	// Flows and Capacity are the live flows and the tables' capacity by
	// protocol (tcp, udp, icmp).
	Flows    map[string]int64 `json:"flows"`
	Capacity map[string]int64 `json:"capacity"`
}

// Error is the body of every failed request.
type Error struct {
	Error string `json:"error"`
}

// forwardOf is the API's view of an open forward.
func forwardOf(f tcpstack.ForwardInfo) Forward {
	return Forward{ID: f.ID, Protocol: f.Proto.String(), Address: f.HostAddr.String(),
		HostPort: f.HostPort, GuestPort: f.GuestPort, Interface: f.Iface}
}

func forwardsOf(fs []tcpstack.ForwardInfo) Forwards {
	out := Forwards{Forwards: []Forward{}}
	for _, f := range fs {
		out.Forwards = append(out.Forwards, forwardOf(f))
	}
	return out
}

// statusOf is the API's view of the Stack's status and forwards.
func statusOf(st tcpstack.Status, fws []tcpstack.ForwardInfo, offered int) Status {
	out := Status{
		Queues:   QueueStatus{Offered: offered, Pairs: []PairStatus{}},
		Flows:    map[string]int64{},
		Forwards: map[string]int{stats.FlowTCP.String(): 0, stats.FlowUDP.String(): 0},
	}
	g := &out.Guest
	if st.GuestMACOK {
		g.MAC = net.HardwareAddr(st.GuestMAC[:]).String()
	}
	g.IPv4, g.IPv6 = addrString(st.Config4), addrString(st.Config6)
	g.DHCPLeases, g.DHCPv6Leases = st.Leases4, st.Leases6
	g.Seen = []string{}
	for _, a := range st.Seen {
		g.Seen = append(g.Seen, a.String())
	}
	for p := stats.FlowProto(0); p < stats.NumFlowProtos; p++ {
		out.Flows[p.String()] = 0
	}
	for _, ps := range st.Pairs {
		pj := PairStatus{Index: ps.Index, Running: ps.Running, Flows: map[string]int64{}, Capacity: map[string]int64{}}
		for p := stats.FlowProto(0); p < stats.NumFlowProtos; p++ {
			pj.Flows[p.String()] = ps.Flows[p]
			pj.Capacity[p.String()] = ps.Capacity[p]
			out.Flows[p.String()] += ps.Flows[p]
		}
		out.Queues.Pairs = append(out.Queues.Pairs, pj)
	}
	for _, f := range fws {
		out.Forwards[f.Proto.String()]++
	}
	return out
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

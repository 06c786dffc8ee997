package tcpstack

import (
	"net/netip"
	"slices"

	"vunet/tcpstack/stats"
)

// Status is what the Stack can say about the guest and its queue pairs at
// one moment (the control endpoint's status).
type Status struct {
	// GuestMAC is the guest's MAC address, learned from its frames,
	// announced or configured; ok false when none is known yet.
	GuestMAC   [6]byte
	GuestMACOK bool
	// Config4 and Config6 are the addresses the guest is offered (DHCP,
	// DHCPv6); invalid when that family is off or has none.
	Config4, Config6 netip.Addr
	// Leases4 and Leases6 count the DHCPACKs and DHCPv6 REPLYs with an
	// address the guest was sent.
	Leases4, Leases6 uint64
	// Seen are the guest's addresses as its own TCP segments gave them
	// (any pair; at most one per family and pair).
	Seen []netip.Addr
	// Pairs are the queue pairs that have run, by index.
	Pairs []PairStatus
}

// PairStatus is one queue pair's part of a Status.
type PairStatus struct {
	Index int
	// Running: the pair's loop runs (the front-end has started its rings).
	Running bool
	// Flows and Capacity are the live flows and table capacities by
	// protocol (stats.FlowTCP, FlowUDP, FlowICMP).
	Flows, Capacity [stats.NumFlowProtos]int64
}

// Status reports the guest and the queue pairs. The guest's learned
// addresses are read on each pair's loop (onPair), the rest from the
// counters.
func (s *Stack) Status() Status {
	st := Status{}
	st.GuestMAC, st.GuestMACOK = s.GuestMAC()
	a := &s.cfg.Addr
	if !a.Disable4 {
		st.Config4 = a.IPv4.Addr
	}
	if !a.Disable6 {
		st.Config6 = a.IPv6.Addr
	}
	s.mu.Lock()
	idx := make([]int, 0, len(s.pairs))
	for i := range s.pairs {
		idx = append(idx, i)
	}
	s.mu.Unlock()
	slices.Sort(idx)
	for _, i := range idx {
		var ps PairStatus
		var v4, v6 netip.Addr
		_ = s.onPair(i, func(p *pairState) { // the pair's state exists
			_, v4, v6 = p.tcp.Guest()
			for f := stats.FlowProto(0); f < stats.NumFlowProtos; f++ {
				ps.Flows[f] = p.st.Flows.Live[f].Load()
				ps.Capacity[f] = p.st.Flows.Capacity[f].Load()
			}
			st.Leases4 += p.st.Proto.DHCPLeases.Load()
			st.Leases6 += p.st.Proto.DHCPv6Leases.Load()
		})
		s.mu.Lock()
		_, ps.Running = s.loops[i]
		s.mu.Unlock()
		ps.Index = i
		st.Pairs = append(st.Pairs, ps)
		for _, a := range []netip.Addr{v4, v6} {
			if a.IsValid() && !slices.Contains(st.Seen, a) {
				st.Seen = append(st.Seen, a)
			}
		}
	}
	return st
}

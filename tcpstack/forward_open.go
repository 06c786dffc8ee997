package tcpstack

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// OpenTCPForwards opens forwarded host TCP ports (passt's -t) and returns
// the port each one listens on, in order. The listeners belong to queue
// pair 0, whose RX ring any front-end sets up; they stay open across pair
// restarts and close with the Stack.
//
// It must be called before pair 0 first starts: the pair's table is only
// touched by its loop goroutine once that runs. On error, the listeners
// opened by this call are closed again.
//
// The guest's MAC and addresses are seeded from the configuration
// (AddrConfig.GuestMAC, IPv4.Addr, IPv6.Addr); until the MAC is known,
// from configuration or from a guest TCP segment, accepted connections are
// refused (see tcpTable.inbound).
func (s *Stack) OpenTCPForwards(fws []TCPForward) ([]uint16, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, running := s.loops[0]; running {
		return nil, fmt.Errorf("open tcp forwards: pair 0: %w", ErrPairRunning)
	}
	ps := s.pairs[0]
	if ps == nil {
		// The same state StartPair creates for a pair's first start.
		ps = &pairState{st: new(QueueStats), tcpStats: new(TCPStats)}
		ps.flows = newFlowTable(s.flowConfig(), ps.st, s.log.With("pair", 0))
		ps.flows.noSockets = s.noHostSockets
		ps.tcp = newTCPTable(s.tcpConfig(0), ps.tcpStats, epollSet{fd: -1})
		s.pairs[0] = ps
	}
	// No loop runs: listeners are registered by the loop's Attach.
	ps.tcp.Detach()
	a := &s.cfg.Addr
	v4, v6 := a.IPv4.Addr, a.IPv6.Addr
	if a.Disable4 {
		v4 = netip.Addr{}
	}
	if a.Disable6 {
		v6 = netip.Addr{}
	}
	ps.tcp.SetGuest(a.GuestMAC, v4, v6)
	first := len(ps.tcp.listeners)
	ports := make([]uint16, 0, len(fws))
	for _, fw := range fws {
		p, err := ps.tcp.Listen(fw)
		if err != nil {
			for _, l := range ps.tcp.listeners[first:] {
				unix.Close(l.fd)
			}
			ps.tcp.listeners = ps.tcp.listeners[:first]
			return nil, fmt.Errorf("open tcp forward %v:%d: %w", fw.HostAddr, fw.HostPort, err)
		}
		ports = append(ports, p)
	}
	return ports, nil
}

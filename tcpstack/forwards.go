package tcpstack

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/stats"
)

// Forward is one forwarded host port (passt's -t and -u): connections or
// datagrams arriving on it go to the guest.
type Forward struct {
	// HostAddr is the address to listen on; the zero Addr means all IPv4
	// addresses (use netip.IPv6Unspecified() for all IPv6 ones).
	HostAddr netip.Addr
	// HostPort is the port to listen on; 0 picks one (see ForwardResult).
	HostPort uint16
	// GuestPort is the guest's port the traffic goes to; 0 means HostPort.
	GuestPort uint16
	// Iface, when set, restricts the port to traffic arriving on that
	// host interface (SO_BINDTODEVICE).
	Iface string
	// Optional makes a failure to open this port a counted, logged miss
	// instead of an error (passt's rule for "all" and exclusion-only
	// specifications, which bind what they can). Running out of file
	// descriptors is an error all the same.
	Optional bool
}

// ForwardResult says what Open bound.
type ForwardResult struct {
	// TCPPorts and UDPPorts are the ports bound, one per forward of the
	// Config in order; 0 for an Optional forward that failed.
	TCPPorts, UDPPorts []uint16
	// Bound counts the ports opened, Failed the Optional ones that
	// could not be.
	Bound, Failed int
}

// Open returns a Stack like New with the forwards of cfg (TCPForwards,
// UDPForwards) open. They belong to queue pair 0, whose RX ring any
// front-end sets up; they stay open across pair restarts and sessions and
// close with the Stack. On error nothing stays open.
//
// The guest's MAC and addresses are seeded from the configuration
// (AddrConfig.GuestMAC, IPv4.Addr, IPv6.Addr); until the MAC is known,
// from configuration or from any guest frame, forwarded TCP connections
// are refused and UDP datagrams are sent to the broadcast MAC.
func Open(cfg Config) (*Stack, ForwardResult, error) {
	s := New(cfg)
	res, err := s.openForwards(s.cfg.TCPForwards, s.cfg.UDPForwards)
	if err != nil {
		s.Close()
		return nil, res, err
	}
	return s, res, nil
}

// fatalForwardError: errors no forward may skip (the process is out of
// descriptors; the next port would fail the same way).
func fatalForwardError(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE)
}

func (s *Stack) openForwards(tcp, udp []Forward) (res ForwardResult, err error) {
	if len(tcp) == 0 && len(udp) == 0 {
		return res, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, running := s.loops[0]; running {
		return res, fmt.Errorf("open forwards: pair 0: %w", ErrPairRunning)
	}
	ps, err := s.pairStateLocked(0)
	if err != nil {
		return res, fmt.Errorf("open forwards: %w", err)
	}
	// No loop runs: listeners are registered by the next loop's attach.
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
	firstTCP, firstUDP := ps.tcp.NumListeners(), ps.flows.NumForwards()
	fs := &s.fwdStats
	undo := func() {
		ps.tcp.CloseListenersFrom(firstTCP)
		ps.flows.CloseForwardsFrom(firstUDP)
		fs.Ports[stats.FlowTCP].Add(-int64(len(res.TCPPorts) - countZero(res.TCPPorts)))
		fs.Ports[stats.FlowUDP].Add(-int64(len(res.UDPPorts) - countZero(res.UDPPorts)))
	}
	kinds := [...]struct {
		proto  stats.FlowProto
		fws    []Forward
		listen func(addr netip.AddrPort, iface string, guestPort uint16) (uint16, error)
		ports  *[]uint16
	}{
		{stats.FlowTCP, tcp, ps.tcp.Listen, &res.TCPPorts},
		{stats.FlowUDP, udp, ps.flows.Listen, &res.UDPPorts},
	}
	for _, k := range kinds {
		for _, fw := range k.fws {
			p, err := k.listen(netip.AddrPortFrom(forwardAddr(fw), fw.HostPort), fw.Iface, fw.GuestPort)
			if err != nil {
				fs.BindFailures[k.proto].Add(1)
				if fw.Optional && !fatalForwardError(err) {
					res.Failed++
					*k.ports = append(*k.ports, 0)
					s.log.Debug(k.proto.String()+" forward not bound", "addr", fw.HostAddr, "port", fw.HostPort, "err", err)
					continue
				}
				undo()
				return res, fmt.Errorf("open %s forward %v:%d: %w", k.proto, fw.HostAddr, fw.HostPort, err)
			}
			fs.Ports[k.proto].Add(1)
			res.Bound++
			*k.ports = append(*k.ports, p)
		}
	}
	return res, nil
}

// countZero counts the zero entries of ports (forwards not bound).
func countZero(ports []uint16) int {
	n := 0
	for _, p := range ports {
		if p == 0 {
			n++
		}
	}
	return n
}

// ForwardStats returns the counters of the forwarded host ports. The
// pointer stays valid for the Stack's lifetime.
func (s *Stack) ForwardStats() *stats.Forwards { return &s.fwdStats }

// forwardAddr is the address a forward listens on: all IPv4 addresses when
// none is set.
func forwardAddr(fw Forward) netip.Addr {
	if !fw.HostAddr.IsValid() {
		return netip.IPv4Unspecified()
	}
	return fw.HostAddr
}

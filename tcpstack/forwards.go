package tcpstack

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

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

// ForwardInfo is one forwarded host port as it is open: one listening
// socket (a port forwarded on both address families is two).
type ForwardInfo struct {
	// ID names the forward for RemoveForwards; IDs are not reused.
	ID uint64
	// Proto is stats.FlowTCP or stats.FlowUDP.
	Proto stats.FlowProto
	// Forward is as asked for, with HostAddr and HostPort as bound and
	// GuestPort resolved.
	Forward
}

// Errors of AddForwards and RemoveForwards, matched with errors.Is.
var (
	ErrForwardOverlap = errors.New("overlaps a forwarded port")
	ErrNoForward      = errors.New("no such forwarded port")
	ErrStackClosed    = errors.New("the data plane is closed")
)

// openForward is a ForwardInfo and where its socket is: the listener's
// slot in pair 0's TCP or datagram table.
type openForward struct {
	ForwardInfo
	slot int
}

// Forwarded ports belong to queue pair 0, whose RX ring any front-end sets
// up; they stay open across pair restarts and sessions and close with the
// Stack. Open opens those of the configuration; AddForwards and
// RemoveForwards change them at run time through pair 0's loop (onPair),
// and the Stack keeps the list (fwds, under fwdMu).

// Open returns a Stack like New with the forwards of cfg (TCPForwards,
// UDPForwards) open. On error nothing stays open.
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
	s.fwdMu.Lock()
	defer s.fwdMu.Unlock()
	perr := s.onPair(0, func(ps *pairState) {
		for _, k := range [...]struct {
			proto stats.FlowProto
			fws   []Forward
			ports *[]uint16
		}{{stats.FlowTCP, tcp, &res.TCPPorts}, {stats.FlowUDP, udp, &res.UDPPorts}} {
			var opened []openForward
			var failed int
			opened, *k.ports, failed, err = s.listen(ps, k.proto, k.fws)
			res.Bound += len(opened)
			res.Failed += failed
			s.register(opened)
			if err != nil {
				return
			}
		}
	})
	if perr != nil {
		return res, fmt.Errorf("open forwards: %w", perr)
	}
	return res, err
}

// listen opens fws on pair 0's tables, on their owner's goroutine (see
// onPair). An Optional forward that fails is skipped (port 0 in ports);
// any other failure closes what this call opened and is returned.
func (s *Stack) listen(ps *pairState, proto stats.FlowProto, fws []Forward) (opened []openForward, ports []uint16, failed int, err error) {
	listen, unlisten := ps.tcp.Listen, ps.tcp.Unlisten
	if proto == stats.FlowUDP {
		listen, unlisten = ps.flows.Listen, ps.flows.CloseForward
	}
	fs := &s.fwdStats
	for _, fw := range fws {
		addr := netip.AddrPortFrom(forwardAddr(fw), fw.HostPort)
		slot, port, err := listen(addr, fw.Iface, fw.GuestPort)
		if err != nil {
			fs.BindFailures[proto].Add(1)
			if fw.Optional && !fatalForwardError(err) {
				failed++
				ports = append(ports, 0)
				s.log.Debug(proto.String()+" forward not bound", "addr", addr, "err", err)
				continue
			}
			for _, o := range opened {
				_ = unlisten(o.slot)
				fs.Ports[proto].Add(-1)
			}
			return nil, ports, failed, fmt.Errorf("open %s forward %v: %w", proto, addr, err)
		}
		fs.Ports[proto].Add(1)
		ports = append(ports, port)
		o := openForward{ForwardInfo: ForwardInfo{Proto: proto, Forward: fw}, slot: slot}
		o.HostAddr, o.HostPort = addr.Addr(), port
		if o.GuestPort == 0 {
			o.GuestPort = port
		}
		opened = append(opened, o)
	}
	return opened, ports, failed, nil
}

// register adds opened to the Stack's list, numbered. s.fwdMu is held.
func (s *Stack) register(opened []openForward) {
	for _, o := range opened {
		s.fwdNext++
		o.ID = s.fwdNext
		s.fwds = append(s.fwds, o)
	}
}

// AddForwards opens forwarded host ports of proto (stats.FlowTCP or
// FlowUDP) while the Stack runs, through pair 0's loop, and returns them
// as open. It is all or nothing: a forward that overlaps one already open
// (same port, the same or a wildcard address of the family) fails the
// call with ErrForwardOverlap before anything is bound, and a failed bind
// closes what the call opened (Optional forwards excepted).
func (s *Stack) AddForwards(proto stats.FlowProto, fws []Forward) ([]ForwardInfo, error) {
	if proto != stats.FlowTCP && proto != stats.FlowUDP {
		return nil, fmt.Errorf("forward protocol %v: only tcp and udp are forwarded", proto)
	}
	s.fwdMu.Lock()
	defer s.fwdMu.Unlock()
	if s.fwdClosed {
		return nil, ErrStackClosed
	}
	if err := s.checkOverlap(proto, fws); err != nil {
		return nil, err
	}
	var opened []openForward
	var err error
	if perr := s.onPair(0, func(ps *pairState) { opened, _, _, err = s.listen(ps, proto, fws) }); perr != nil {
		return nil, perr
	}
	if err != nil {
		return nil, err
	}
	first := len(s.fwds)
	s.register(opened)
	out := make([]ForwardInfo, 0, len(opened))
	for _, o := range s.fwds[first:] {
		out = append(out, o.ForwardInfo)
	}
	return out, nil
}

// checkOverlap refuses forwards of proto that would share a port with an
// open one or with each other. s.fwdMu is held.
func (s *Stack) checkOverlap(proto stats.FlowProto, fws []Forward) error {
	for i, fw := range fws {
		if fw.HostPort == 0 {
			continue // the kernel picks a free one
		}
		for _, o := range s.fwds {
			if o.Proto == proto && forwardsOverlap(fw, o.Forward) {
				return fmt.Errorf("%s %v: %w %d (%s)", proto, netip.AddrPortFrom(forwardAddr(fw), fw.HostPort),
					ErrForwardOverlap, o.ID, describeForward(o.ForwardInfo))
			}
		}
		for _, other := range fws[:i] {
			if forwardsOverlap(fw, other) {
				return fmt.Errorf("%s %v: %w asked for in the same request", proto,
					netip.AddrPortFrom(forwardAddr(fw), fw.HostPort), ErrForwardOverlap)
			}
		}
	}
	return nil
}

// forwardsOverlap reports whether two forwards would listen on one port:
// the same port on the same address, or on the wildcard address of the
// other's family; forwards bound to two different interfaces do not.
func forwardsOverlap(a, b Forward) bool {
	if a.HostPort != b.HostPort || a.Iface != "" && b.Iface != "" && a.Iface != b.Iface {
		return false
	}
	x, y := forwardAddr(a), forwardAddr(b)
	return x == y || x.Is4() == y.Is4() && (x.IsUnspecified() || y.IsUnspecified())
}

// describeForward spells a forward for messages: 0.0.0.0:8080 -> 80.
func describeForward(f ForwardInfo) string {
	s := fmt.Sprintf("%s %v -> %d", f.Proto, netip.AddrPortFrom(f.HostAddr, f.HostPort), f.GuestPort)
	if f.Iface != "" {
		s += " on " + f.Iface
	}
	return s
}

// RemoveForwards closes the forwarded ports with the given IDs, through
// pair 0's loop. It is all or nothing: an ID that names no open forward
// fails the call with ErrNoForward and nothing is closed. A TCP port's
// accepted connections go on; a UDP port's peers lose their flows with it.
func (s *Stack) RemoveForwards(ids []uint64) error {
	s.fwdMu.Lock()
	defer s.fwdMu.Unlock()
	var gone []openForward
	for _, id := range ids {
		i := slices.IndexFunc(s.fwds, func(o openForward) bool { return o.ID == id })
		if i < 0 {
			return fmt.Errorf("forward %d: %w", id, ErrNoForward)
		}
		if !slices.ContainsFunc(gone, func(o openForward) bool { return o.ID == id }) {
			gone = append(gone, s.fwds[i])
		}
	}
	err := s.onPair(0, func(ps *pairState) {
		for _, o := range gone {
			var err error
			if o.Proto == stats.FlowUDP {
				err = ps.flows.CloseForward(o.slot)
			} else {
				err = ps.tcp.Unlisten(o.slot)
			}
			if err != nil { // the list and the tables disagree: a bug
				s.log.Error("remove forward", "forward", describeForward(o.ForwardInfo), "err", err)
				continue
			}
			s.fwdStats.Ports[o.Proto].Add(-1)
		}
	})
	if err != nil { // pair 0's state exists: its forwards are there
		return err
	}
	s.fwds = slices.DeleteFunc(s.fwds, func(o openForward) bool {
		return slices.ContainsFunc(gone, func(g openForward) bool { return g.ID == o.ID })
	})
	return nil
}

// Forwards returns the forwarded ports open, in the order they were
// opened.
func (s *Stack) Forwards() []ForwardInfo {
	s.fwdMu.Lock()
	defer s.fwdMu.Unlock()
	out := make([]ForwardInfo, len(s.fwds))
	for i, o := range s.fwds {
		out[i] = o.ForwardInfo
	}
	return out
}

// forwardAddr is the address a forward listens on: all IPv4 addresses when
// none is set.
func forwardAddr(fw Forward) netip.Addr {
	if !fw.HostAddr.IsValid() {
		return netip.IPv4Unspecified()
	}
	return fw.HostAddr
}

// ForwardStats returns the counters of the forwarded host ports. The
// pointer stays valid for the Stack's lifetime.
func (s *Stack) ForwardStats() *stats.Forwards { return &s.fwdStats }

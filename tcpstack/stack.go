package tcpstack

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/dgram"
	"vunet/tcpstack/flowdir"
	"vunet/tcpstack/handover"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/stats"
	"vunet/tcpstack/tcp"
	"vunet/virtqueue"
)

// Stack is the data plane: it runs one event loop per started queue pair.
// It implements virtqueue's data-plane contract (DataPlane, Announcer,
// SessionEnder, MTUSetter) directly: the control plane drives it with no
// adapter in between.
type Stack struct {
	cfg    Config
	log    *slog.Logger
	policy *addrpolicy.Policy // what guest flows may reach, and where they go

	mtu      atomic.Int64
	guestMAC atomic.Uint64 // learned or announced guest MAC, 48 bits; 0 = unknown

	// noHostSockets makes guest flows stop short of opening host sockets
	// (fuzzing must not send to whatever addresses the fuzzer invents).
	noHostSockets bool

	faultLog stats.Limiter // memory-fault log lines, across the Stack's loops
	fwdStats stats.Forwards

	// The forwarded ports open (forwards.go). fwdMu serializes their
	// changes and is taken before mu.
	fwdMu     sync.Mutex
	fwds      []openForward
	fwdNext   uint64
	fwdClosed bool // Close ran: no more forwards

	mu       sync.Mutex
	loops    map[int]*loop
	stopping map[*loop]struct{} // taken out of loops by StopPair, not stopped yet
	closed   bool               // Close began: no loop starts any more
	pairs    map[int]*pairState

	// dir names the pair holding each flow, and byIndex finds a pair's
	// state, both without s.mu: the loops hand flows to each other
	// (moves.go).
	dir     *flowdir.Dir
	byIndex [flowdir.MaxPairs]atomic.Pointer[pairState]

	mig migration // live migration on one host (migration.go)
	// Across hosts (device_state.go): the TCP_REPAIR helper, and the
	// connections SaveState read out, kept until the guest runs elsewhere.
	repair *hostsock.RepairHelper
	saved  []handover.Item

	// streamLink is the stream transport's state (ServeStream), its
	// buffers kept from one connection to the next.
	streamLink *streamLink
}

// pairState is what a queue pair keeps across loop restarts (the control
// plane stops and restarts pairs on every ring or memory-table change): its
// counters and its flows and connections, whose sockets stay open and are
// re-registered with the next loop's epoll set, and its part in moving
// flows between pairs (moves.go).
type pairState struct {
	index int
	// dgramState holds a datagram flow's state while it is handed off or
	// imported, so that the message it travels in stays on the stack
	// (moves.go). Only the goroutine that owns the pair's tables uses it.
	dgramState [dgram.StateSize]byte
	st         *stats.Queue
	tcpStats   *stats.TCP
	flows      *dgram.Table
	tcp        *tcp.Table

	// Moves between pairs: the pair's shard of the directory (nil beyond
	// flowdir.MaxPairs: its flows stay its own), its mailbox, the fetches
	// it has open and the requests it keeps waiting. Only the pair's loop
	// touches claims and wants, or the control path while none runs.
	shard            *flowdir.Shard
	self             flowdir.Pairs // just this pair
	mail             *mailbox
	claims           []claim
	wants            []moveMsg
	tcpDir, dgramDir pairDir
	loop             *loop // the running loop, for its own goroutine; nil between loops
}

// New returns a Stack with no running pairs.
func New(cfg Config) *Stack {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Addr.OurMAC.IsZero() {
		cfg.Addr.OurMAC = linksvc.DefaultOurMAC
	}
	if cfg.MaxFlows <= 0 {
		cfg.MaxFlows = 1024
	}
	if cfg.UDPTimeout <= 0 {
		cfg.UDPTimeout = 180 * time.Second
	}
	if cfg.ICMPTimeout <= 0 {
		cfg.ICMPTimeout = 60 * time.Second
	}
	s := &Stack{
		cfg:      cfg,
		log:      cfg.Logger,
		policy:   newAddrPolicy(&cfg),
		loops:    make(map[int]*loop),
		stopping: make(map[*loop]struct{}),
		pairs:    make(map[int]*pairState),
		dir:      flowdir.New(),
	}
	s.mtu.Store(int64(cfg.Addr.EffectiveMTU()))
	tcp.ProbeKernel(cfg.TCP)
	// A configured guest MAC addresses frames to the guest (forwarded
	// datagrams) before the guest has sent any.
	s.guestMAC.Store(macToU64(cfg.Addr.GuestMAC))
	return s
}

// The control plane finds the optional interfaces by type assertion: a
// method lost here would silently switch a feature off.
var (
	_ virtqueue.DataPlane     = (*Stack)(nil)
	_ virtqueue.Announcer     = (*Stack)(nil)
	_ virtqueue.SessionEnder  = (*Stack)(nil)
	_ virtqueue.MTUSetter     = (*Stack)(nil)
	_ virtqueue.Migrator      = (*Stack)(nil)
	_ virtqueue.StateTransfer = (*Stack)(nil)
)

// ErrPairRunning is returned by StartPair for a pair that is already running.
var ErrPairRunning = errors.New("queue pair already running")

// ErrClosed is StartPair's and ServeStream's error once Close began.
var ErrClosed = errors.New("stack closed")

// StartPair starts the event loop of qp. It returns once the loop's epoll set
// is built, so errors in setting it up are reported here.
func (s *Stack) StartPair(qp virtqueue.QueuePair) error {
	if qp.RX == nil || qp.TX == nil {
		return fmt.Errorf("start pair %d: nil ring", qp.Index)
	}
	if qp.Index < 0 {
		return fmt.Errorf("start pair %d: negative index", qp.Index)
	}
	s.resumeHere()
	s.awaitArrival()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("start pair %d: %w", qp.Index, ErrClosed)
	}
	if _, ok := s.loops[qp.Index]; ok {
		return fmt.Errorf("start pair %d: %w", qp.Index, ErrPairRunning)
	}
	ps, err := s.pairStateLocked(qp.Index)
	if err != nil {
		return fmt.Errorf("start pair %d: %w", qp.Index, err)
	}
	s.importPending(qp.Index, ps)
	s.resumeSavedLocked()
	st := ps.st
	l, err := newLoop(s, qp, ps, nil)
	if err != nil {
		return fmt.Errorf("start pair %d: %w", qp.Index, err)
	}
	st.LoopStarts.Add(1)
	s.loops[qp.Index] = l
	reserveP(1)
	go l.run()
	s.log.Debug("data plane: queue pair started", "pair", qp.Index, "rx_enabled", qp.RXEnabled,
		"tx_enabled", qp.TXEnabled, "features", fmt.Sprintf("%#x", qp.Features))
	return nil
}

// StopPair stops the loop of pair index and returns when it no longer touches
// the pair's rings: every popped chain is pushed and flushed and unused RX
// reservations are rewound, so LastAvail of both rings is consistent.
// Stopping a pair that is not running does nothing.
func (s *Stack) StopPair(index int) {
	s.mu.Lock()
	l := s.loops[index]
	delete(s.loops, index)
	if l != nil {
		s.stopping[l] = struct{}{}
	}
	s.mu.Unlock()
	if l == nil {
		return
	}
	l.stop()
	s.mu.Lock()
	delete(s.stopping, l)
	s.mu.Unlock()
	s.log.Debug("data plane: queue pair stopped", "pair", index)
}

// Announce records mac as the guest's MAC address (vhost-user SEND_RARP after
// a migration). The stack is the guest's only neighbour, so there is no switch
// to teach; frames to the guest use this address until the guest sends from
// another one.
func (s *Stack) Announce(mac [6]byte) {
	s.guestMAC.Store(macToU64(mac))
	s.log.Info("guest announced", "mac", fmtMAC(mac))
}

// SetMTU sets the guest MTU (vhost-user NET_SET_MTU).
func (s *Stack) SetMTU(mtu int) {
	if mtu <= 0 {
		return
	}
	s.mtu.Store(int64(mtu))
}

// MTU returns the current guest MTU.
func (s *Stack) MTU() int { return int(s.mtu.Load()) }

// GuestMAC returns the guest's MAC as last learned from a TX frame or
// announced; ok is false until one is known.
func (s *Stack) GuestMAC() (mac [6]byte, ok bool) {
	v := s.guestMAC.Load()
	if v == 0 {
		return mac, false
	}
	return u64ToMAC(v), true
}

// PairStats returns the counters of pair index, or nil if the pair has never
// been started. The pointer stays valid for the Stack's lifetime.
func (s *Stack) PairStats(index int) *stats.Queue {
	if ps := s.startedPair(index); ps != nil {
		return ps.st
	}
	return nil
}

// stopAllPairs stops every running pair's loop. StopPair takes s.mu, so
// the indices are collected first.
func (s *Stack) stopAllPairs() {
	s.mu.Lock()
	idx := make([]int, 0, len(s.loops))
	for i := range s.loops {
		idx = append(idx, i)
	}
	// Loops another goroutine is stopping (it took them out of s.loops
	// first) have not left the tables yet either.
	var others []*loop
	for l := range s.stopping {
		others = append(others, l)
	}
	s.mu.Unlock()
	for _, i := range idx {
		s.StopPair(i)
	}
	for _, l := range others {
		<-l.done
	}
}

// Close stops every running pair and closes every flow's host socket.
func (s *Stack) Close() {
	// No forward changes from here on (fwdMu comes before mu).
	s.fwdMu.Lock()
	defer s.fwdMu.Unlock()
	// A loop started after stopAllPairs looked would run on while the
	// tables below are closed under it (a stream session that a new
	// connection started during Close did, under -race).
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.closeMigration()
	s.stopAllPairs()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleMovesLocked()
	for _, ps := range s.pairs {
		ps.flows.Close()
		ps.tcp.Close()
		ps.mail.close()
	}
	for p := range s.fwdStats.Ports {
		s.fwdStats.Ports[p].Store(0)
	}
	s.fwds = nil
	s.fwdClosed = true
}

// EndSession closes every flow and connection of every pair, with an RST to
// TCP host peers, and forgets a learned guest MAC address; forwarded-port
// listeners stay. The control plane calls it when the front-end leaves or
// resets the device: the guest side of those flows no longer exists, and a
// peer that waited for its own timeout would hang for minutes.
func (s *Stack) EndSession() {
	s.awaitCommit()
	s.dropPending()
	s.stopAllPairs()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleMovesLocked()
	for _, ps := range s.pairs {
		ps.flows.CloseFlows()
		ps.tcp.ResetConnections()
	}
	s.saved = nil
	// The next guest may have another MAC; a configured one stays.
	s.guestMAC.Store(macToU64(s.cfg.Addr.GuestMAC))
}

// PairTCPStats returns the TCP translation counters of pair index, or nil
// if the pair has never been started.
func (s *Stack) PairTCPStats(index int) *stats.TCP {
	if ps := s.startedPair(index); ps != nil {
		return ps.tcpStats
	}
	return nil
}

// startedPair returns pair index's state, or nil if the pair has never
// been started. Its counters are made with it and never replaced, so they
// may be read without s.mu.
func (s *Stack) startedPair(index int) *pairState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pairs[index]
}

func macToU64(m [6]byte) uint64 {
	return uint64(m[0])<<40 | uint64(m[1])<<32 | uint64(m[2])<<24 |
		uint64(m[3])<<16 | uint64(m[4])<<8 | uint64(m[5])
}

func u64ToMAC(v uint64) [6]byte {
	return [6]byte{byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
}

func fmtMAC(m [6]byte) string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5])
}

// pairStateLocked returns pair index's state, creating what StartPair
// creates for a pair's first start. s.mu is held.
func (s *Stack) pairStateLocked(index int) (*pairState, error) {
	if ps := s.pairs[index]; ps != nil {
		return ps, nil
	}
	mail, err := newMailbox()
	if err != nil {
		return nil, fmt.Errorf("mailbox eventfd: %w", err)
	}
	ps := &pairState{index: index, st: new(stats.Queue), tcpStats: new(stats.TCP), mail: mail}
	ps.flows = dgram.New(s.dgramConfig(index), ps.st)
	ps.tcp = tcp.New(s.tcpConfig(index), ps.tcpStats, ps.st)
	// Forwarded connections go to the configured guest until its traffic
	// says otherwise.
	a := &s.cfg.Addr
	v4, v6 := a.IPv4.Addr, a.IPv6.Addr
	if a.Disable4 {
		v4 = netip.Addr{}
	}
	if a.Disable6 {
		v6 = netip.Addr{}
	}
	ps.tcp.SetGuestDefaults(a.GuestMAC, v4, v6)
	// Room for every flow and connection of the pair, and its fetches.
	if ps.shard = s.dir.Shard(index, 2*s.cfg.MaxFlows+maxClaims); ps.shard != nil {
		ps.self.Add(index)
		ps.tcpDir = pairDir{ps: ps, kind: moveTCP}
		ps.dgramDir = pairDir{ps: ps, kind: moveDgram}
		ps.tcp.SetDirectory(&ps.tcpDir)
		ps.flows.SetDirectory(&ps.dgramDir)
		s.byIndex[index].Store(ps)
	}
	s.pairs[index] = ps
	return ps, nil
}

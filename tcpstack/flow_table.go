package tcpstack

import (
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// flowKind says which translation a flow does.
type flowKind uint8

const (
	flowUDP  flowKind = iota + 1 // guest UDP 4-tuple ↔ connected host UDP socket
	flowICMP                     // guest echo id ↔ host ping socket
)

// flowKey identifies a flow by what the guest sees. IPv4 addresses use the
// first four bytes of the arrays.
type flowKey struct {
	kind                  flowKind
	v6                    bool
	guestIP, remoteIP     [16]byte
	guestPort, remotePort uint16 // ICMP: guestPort is the echo identifier
}

// packetKey is the key of the flow a guest packet belongs to: the guest's
// address is its source, the remote's its destination; guestPort is the
// echo identifier for ICMP.
func packetKey(kind flowKind, p *header.Packet, guestPort, remotePort uint16) flowKey {
	k := flowKey{kind: kind, v6: p.IsIPv6(), guestPort: guestPort, remotePort: remotePort}
	if k.v6 {
		k.guestIP, k.remoteIP = p.Src.As16(), p.Dst.As16()
	} else {
		s, d := p.Src.As4(), p.Dst.As4()
		copy(k.guestIP[:], s[:])
		copy(k.remoteIP[:], d[:])
	}
	return k
}

func (k *flowKey) guestAddr() netip.Addr  { return keyAddr(k.v6, &k.guestIP) }
func (k *flowKey) remoteAddr() netip.Addr { return keyAddr(k.v6, &k.remoteIP) }

func keyAddr(v6 bool, b *[16]byte) netip.Addr {
	if v6 {
		return netip.AddrFrom16(*b)
	}
	return netip.AddrFrom4([4]byte(b[:4]))
}

// flow is one slot of the flow table.
type flow struct {
	key      flowKey
	fd       int
	gen      uint32 // bumped on every reuse of the slot; part of the epoll token
	inUse    bool
	queued   bool // in the ready list (may outlive the flow: skipped then)
	lastUsed time.Time
}

// flowConfig is the part of the Stack's Config the flows use.
type flowConfig struct {
	maxFlows                int
	policy                  *addrpolicy.Policy // what flows may reach and where they go
	ourMAC                  [6]byte
	udpTimeout, icmpTimeout time.Duration
	bind4, bind6            netip.Addr // source addresses of host sockets (Config.Outbound4/6)
	guest4, guest6          netip.Addr // the guest's addresses, destinations of forwarded datagrams
}

// flowTable holds the UDP and ICMP echo flows of one queue pair. It outlives
// the pair's loops (sockets are re-registered with each new epoll set) and
// is used by one loop goroutine at a time.
type flowTable struct {
	cfg   flowConfig
	st    *stats.Queue
	log   *slog.Logger
	flows []flow
	free  []int32
	byKey map[flowKey]int32
	live  int

	// ready is a FIFO of slots whose sockets reported readability (epoll is
	// edge-triggered): they are read until EAGAIN or until the guest's RX
	// ring runs out, in which case they stay queued for the refill.
	readyQ        []int32
	rHead, rCount int

	ep        *hostsock.Epoll // the running loop's; nil between loops
	policy    stats.PolicyGate
	noSockets bool // Stack.noHostSockets
	io        hostsock.IO
	now       time.Time
	nextSweep time.Time
	ipID      uint16
	warnLimit stats.Limiter
	discard   [65536]byte // datagrams the guest cannot take are read into it
	discardIO [1][]byte

	// Forwarded host UDP ports (pair 0 only), see udp_forward.go.
	fwd        []udpListener
	fwdPending bool                // some listener has unread datagrams
	fwdFrom    unix.RawSockaddrAny // source address of the last forwarded datagram
}

func newFlowTable(cfg flowConfig, st *stats.Queue, log *slog.Logger) *flowTable {
	ft := &flowTable{
		cfg:    cfg,
		st:     st,
		log:    log,
		flows:  make([]flow, cfg.maxFlows),
		free:   make([]int32, 0, cfg.maxFlows),
		byKey:  make(map[flowKey]int32, cfg.maxFlows),
		readyQ: make([]int32, cfg.maxFlows),
		policy: stats.PolicyGate{Policy: cfg.policy, Stats: st, Log: log},
	}
	for i := cfg.maxFlows - 1; i >= 0; i-- {
		ft.free = append(ft.free, int32(i))
		ft.flows[i].fd = -1
	}
	ft.discardIO[0] = ft.discard[:]
	return ft
}

func (ft *flowTable) token(i int32) hostsock.Token {
	f := &ft.flows[i]
	o := hostsock.OwnerUDP
	if f.key.kind == flowICMP {
		o = hostsock.OwnerICMP
	}
	return hostsock.NewToken(o, f.gen, uint32(i))
}

// attach registers every open socket with a new loop's epoll set. The
// sockets are also queued as ready: data may have arrived meanwhile.
func (ft *flowTable) attach(ep *hostsock.Epoll) error {
	ft.ep = ep
	ft.now = time.Now()
	for i := range ft.flows {
		f := &ft.flows[i]
		if !f.inUse {
			continue
		}
		if err := ep.Add(f.fd, unix.EPOLLIN|unix.EPOLLET, ft.token(int32(i))); err != nil {
			ft.log.Warn("re-register flow socket, flow closed", "err", err)
			ft.closeFlow(int32(i))
			continue
		}
		ft.enqueue(int32(i))
	}
	ft.attachForwards(ep)
	return nil
}

// detach forgets the epoll set of a loop that ended (closing it removed the
// registrations).
func (ft *flowTable) detach() { ft.ep = nil }

// lookup returns the flow for key, opening its host socket when absent and
// the address policy allows it. A failure is counted as a TX drop and
// returned as why.
func (ft *flowTable) lookup(key *flowKey) (i int32, why stats.DropReason, ok bool) {
	if i, ok := ft.byKey[*key]; ok {
		ft.flows[i].lastUsed = ft.now
		return i, 0, true
	}
	proto := addrpolicy.UDP
	if key.kind == flowICMP {
		proto = addrpolicy.ICMP
	}
	v := ft.policy.Outbound(ft.now, proto, key.guestAddr(), netip.AddrPortFrom(key.remoteAddr(), key.remotePort))
	if !v.Allowed() {
		return 0, stats.DropPolicy, false
	}
	if ft.noSockets {
		ft.st.TX.Drops[stats.DropNoFlow].Add(1)
		return 0, stats.DropNoFlow, false
	}
	if len(ft.free) == 0 {
		// Full: the least recently used flow makes room, so a guest that
		// touched many destinations is not locked out for a whole timeout.
		ft.evictOldest()
		ft.st.FlowsEvicted.Add(1)
		ft.warn("flow table full, oldest flow closed", "max", ft.cfg.maxFlows)
	}
	var fd int
	var err error
	if key.kind == flowICMP {
		fd, err = ft.openICMP(key, v.Host)
	} else {
		fd, err = ft.openUDP(key, v.Host)
	}
	if err != nil {
		ft.st.TX.Drops[stats.DropNoFlow].Add(1)
		ft.warn("cannot open host socket for flow", "err", err, "kind", key.kind,
			"remote", key.remoteAddr(), "port", key.remotePort, "host", v.Host)
		return 0, stats.DropNoFlow, false
	}
	i, ok = ft.adopt(key, fd)
	if !ok {
		ft.st.TX.Drops[stats.DropNoFlow].Add(1)
		return 0, stats.DropNoFlow, false
	}
	return i, 0, true
}

// adopt makes fd, an open host socket, the flow for key. The table must
// have a free slot. On failure fd is closed.
func (ft *flowTable) adopt(key *flowKey, fd int) (int32, bool) {
	i := ft.free[len(ft.free)-1]
	ft.free = ft.free[:len(ft.free)-1]
	f := &ft.flows[i]
	f.key, f.fd, f.inUse, f.lastUsed = *key, fd, true, ft.now
	f.gen++
	if ft.ep != nil {
		if err := ft.ep.Add(fd, unix.EPOLLIN|unix.EPOLLET, ft.token(i)); err != nil {
			ft.warn("register flow socket", "err", err)
			ft.closeFlow(i)
			return 0, false
		}
	}
	ft.byKey[*key] = i
	ft.live++
	ft.st.FlowsOpened.Add(1)
	ft.kindGauge(key.kind).Add(1)
	if ft.nextSweep.IsZero() {
		ft.nextSweep = ft.now.Add(ft.sweepInterval())
	}
	return i, true
}

func (ft *flowTable) closeFlow(i int32) {
	f := &ft.flows[i]
	if !f.inUse {
		return
	}
	unix.Close(f.fd) // also leaves the epoll set
	f.fd = -1
	f.inUse = false
	if j, ok := ft.byKey[f.key]; ok && j == i {
		delete(ft.byKey, f.key)
	}
	ft.free = append(ft.free, i)
	ft.live--
	ft.st.FlowsClosed.Add(1)
	ft.kindGauge(f.key.kind).Add(-1)
}

// kindGauge is the live-flow gauge of a flow kind.
func (ft *flowTable) kindGauge(k flowKind) *atomic.Int64 {
	if k == flowICMP {
		return &ft.st.Proto.ICMPFlows
	}
	return &ft.st.Proto.UDPFlows
}

// evictOldest closes the flow used least recently. Only called when the
// table is full, on flow creation: a linear scan is fine there.
func (ft *flowTable) evictOldest() {
	oldest := int32(-1)
	for i := range ft.flows {
		f := &ft.flows[i]
		if f.inUse && (oldest < 0 || f.lastUsed.Before(ft.flows[oldest].lastUsed)) {
			oldest = int32(i)
		}
	}
	if oldest >= 0 {
		ft.closeFlow(oldest)
	}
}

// closeAll closes every flow (the Stack is closing).
func (ft *flowTable) closeAll() {
	for i := range ft.flows {
		ft.closeFlow(int32(i))
	}
	ft.rCount = 0
}

func (ft *flowTable) enqueue(i int32) {
	f := &ft.flows[i]
	if f.queued || ft.rCount == len(ft.readyQ) {
		return
	}
	f.queued = true
	ft.readyQ[(ft.rHead+ft.rCount)%len(ft.readyQ)] = i
	ft.rCount++
}

// ready handles an epoll event for a flow socket.
func (ft *flowTable) ready(tok hostsock.Token, events uint32) {
	i, gen := int32(tok.Slot()), tok.Gen()
	if i < 0 || int(i) >= len(ft.flows) {
		return
	}
	f := &ft.flows[i]
	if !f.inUse || f.gen&hostsock.GenMask != gen {
		return // stale event for a closed or reused slot
	}
	ft.enqueue(i)
}

// flowBudget bounds the datagrams one flow delivers per turn, so one busy
// socket cannot starve the others.
const flowBudget = 32

// flush delivers queued sockets' data to the guest. It returns true when
// work is left that does not depend on the guest (budget used up).
func (ft *flowTable) flush(l *loop) (more bool) {
	if ft.fwdPending {
		var blocked bool
		if more, blocked = ft.flushForwards(l); blocked {
			return more
		}
	}
	for n := ft.rCount; n > 0 && ft.rCount > 0; n-- {
		i := ft.readyQ[ft.rHead]
		f := &ft.flows[i]
		if !f.inUse {
			f.queued = false
			ft.rHead = (ft.rHead + 1) % len(ft.readyQ)
			ft.rCount--
			continue
		}
		var r flowRead
		switch f.key.kind {
		case flowUDP:
			r = ft.readUDP(l, i)
		case flowICMP:
			r = ft.readICMP(l, i)
		}
		switch r {
		case flowDrained:
			f.queued = false
			ft.rHead = (ft.rHead + 1) % len(ft.readyQ)
			ft.rCount--
		case flowBudgetUsed:
			// To the back of the queue.
			ft.rHead = (ft.rHead + 1) % len(ft.readyQ)
			ft.readyQ[(ft.rHead+ft.rCount-1)%len(ft.readyQ)] = i
			more = true
		case flowBlocked:
			return more // the guest has no buffers: everything waits for the refill
		}
	}
	return more
}

// flowRead is the outcome of reading one flow's socket.
type flowRead uint8

const (
	flowDrained    flowRead = iota // EAGAIN (or the socket failed): dequeue
	flowBudgetUsed                 // more data, let others go first
	flowBlocked                    // no RX buffer: keep queued, stop flushing
)

func (ft *flowTable) sweepInterval() time.Duration {
	d := min(ft.cfg.udpTimeout, ft.cfg.icmpTimeout) / 4
	return max(d, 10*time.Millisecond)
}

// nextDeadline is when expire should run next; zero when no flow is open.
func (ft *flowTable) nextDeadline() time.Time {
	if ft.live == 0 {
		return time.Time{}
	}
	return ft.nextSweep
}

// expire closes flows idle for longer than their timeout.
func (ft *flowTable) expire(now time.Time) {
	ft.now = now
	if ft.live == 0 {
		ft.nextSweep = time.Time{}
		return
	}
	if now.Before(ft.nextSweep) {
		return
	}
	for i := range ft.flows {
		f := &ft.flows[i]
		if !f.inUse {
			continue
		}
		to := ft.cfg.udpTimeout
		if f.key.kind == flowICMP {
			to = ft.cfg.icmpTimeout
		}
		if now.Sub(f.lastUsed) >= to {
			ft.closeFlow(int32(i))
		}
	}
	ft.nextSweep = now.Add(ft.sweepInterval())
}

func (ft *flowTable) warn(msg string, args ...any) {
	if ok, _ := ft.warnLimit.Allow(ft.now, time.Second); ok {
		ft.log.Warn(msg, args...)
	}
}

func (ft *flowTable) nextIPID() uint16 {
	ft.ipID++
	return ft.ipID
}

// openDgram opens a non-blocking datagram socket of proto connected to
// host, where the address policy sends key's remote end.
func (ft *flowTable) openDgram(host netip.AddrPort, proto int) (int, error) {
	return hostsock.DialDatagram(host, proto, hostsock.Source{V4: ft.cfg.bind4, V6: ft.cfg.bind6})
}

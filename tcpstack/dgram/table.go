package dgram

import (
	"log/slog"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// Config configures a Table.
type Config struct {
	// MaxFlows bounds the flows the guest opens; a datagram that needs a
	// new flow beyond it makes the least recently used of them go.
	MaxFlows int
	// MaxInboundFlows bounds the flows opened for peers of forwarded UDP
	// ports, apart from the guest's own (default MaxFlows/4, at least 1):
	// a peer's first datagram beyond it makes the least recently used of
	// those go, never one of the guest's (lru.go).
	MaxInboundFlows int
	// UDPTimeout and ICMPTimeout close flows idle for that long.
	UDPTimeout, ICMPTimeout time.Duration
	// Policy is what flows may reach and where they go.
	Policy *addrpolicy.Policy
	// OurMAC is the source MAC of frames to the guest.
	OurMAC header.MAC
	// GuestMAC gives the destination MAC of frames to the guest; until one
	// is known they are broadcast.
	GuestMAC MACSource
	// Source is what host sockets bind to before they connect.
	Source hostsock.Source
	// Guest4 and Guest6 are the guest's addresses, the destinations of
	// datagrams to forwarded ports.
	Guest4, Guest6 netip.Addr
	// NoHostSockets makes flows stop short of opening host sockets (for
	// fuzzing the TX path without reaching whatever addresses a fuzzer
	// invents); a datagram that needs one is dropped as DropNoFlow.
	NoHostSockets bool
	// Logger receives warnings (rate-limited).
	Logger *slog.Logger
}

// MACSource says the guest's MAC address once it is known.
type MACSource interface {
	GuestMAC() (mac [6]byte, ok bool)
}

// Table holds the UDP and ICMP echo flows of one queue pair and its
// forwarded UDP ports. It outlives the pair's loops (sockets are
// re-registered with each new epoll set) and is used by one loop goroutine
// at a time.
type Table struct {
	cfg   Config
	st    *stats.Queue
	log   *slog.Logger
	flows []flow
	free  []int32
	byKey map[flowKey]int32
	live  int
	lru   [numClasses]lruList

	// ready is a FIFO of slots whose sockets reported readability (epoll is
	// edge-triggered): they are read until EAGAIN or until the guest's RX
	// ring runs out, in which case they stay queued for the refill.
	readyQ        []int32
	rHead, rCount int

	ep        *hostsock.Epoll // the running loop's; nil between loops
	policy    stats.PolicyGate
	dir       Directory        // the flows of the other queue pairs (directory.go); nil: alone
	guestCsum bool             // the guest takes partial checksums (VIRTIO_NET_F_GUEST_CSUM)
	vh        virtqueue.NetHdr // of the frame being committed
	io        hostsock.IO
	now       time.Time
	nextSweep time.Time
	ipID      uint16
	warnLimit stats.Limiter
	discard   [65536]byte // datagrams the guest cannot take are read into it
	discardIO [1][]byte

	// Forwarded host UDP ports (pair 0 only), see forward.go; fwdFree
	// are the slots of closed ones.
	fwd        []udpListener
	fwdFree    []int
	fwdPending bool                // some listener has unread datagrams
	fwdFrom    unix.RawSockaddrAny // source address of the last forwarded datagram
}

// New returns an empty table counting into st.
func New(cfg Config, st *stats.Queue) *Table {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxInboundFlows <= 0 {
		cfg.MaxInboundFlows = max(cfg.MaxFlows/4, 1)
	}
	// Each class has its quota of slots: a class at its quota always
	// finds a free slot once it evicted its own oldest.
	slots := cfg.MaxFlows + cfg.MaxInboundFlows
	ft := &Table{
		cfg:    cfg,
		st:     st,
		log:    cfg.Logger,
		flows:  make([]flow, slots),
		free:   make([]int32, 0, slots),
		byKey:  make(map[flowKey]int32, slots),
		readyQ: make([]int32, slots),
		policy: stats.PolicyGate{Policy: cfg.Policy, Stats: st, Log: cfg.Logger},
	}
	for i := slots - 1; i >= 0; i-- {
		ft.free = append(ft.free, int32(i))
		ft.flows[i].fd = -1
		ft.flows[i].prev, ft.flows[i].next = -1, -1
	}
	for c := range ft.lru {
		ft.lru[c].init()
	}
	ft.discardIO[0] = ft.discard[:]
	ft.publishCapacity()
	return ft
}

// SetGuestCsum records whether the guest takes partial checksums
// (VIRTIO_NET_F_GUEST_CSUM): its datagrams then leave the UDP checksum to it.
func (ft *Table) SetGuestCsum(on bool) { ft.guestCsum = on }

func (ft *Table) token(i int32) hostsock.Token {
	f := &ft.flows[i]
	o := hostsock.OwnerUDP
	if f.key.kind == flowICMP {
		o = hostsock.OwnerICMP
	}
	return hostsock.NewToken(o, f.gen, uint32(i))
}

// Attach registers every open socket with a new loop's epoll set. The
// sockets are also queued as ready: data may have arrived meanwhile.
func (ft *Table) Attach(ep *hostsock.Epoll, now time.Time) {
	ft.ep = ep
	ft.now = now
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
}

// Detach forgets the epoll set of a loop that ended (closing it removed the
// registrations).
func (ft *Table) Detach() { ft.ep = nil }

// lookup returns the flow for key, opening its host socket when absent and
// the address policy allows it. A failure is counted as a TX drop and
// returned as why.
func (ft *Table) lookup(key *flowKey) (i int32, why stats.DropReason, ok bool) {
	if i, ok := ft.byKey[*key]; ok {
		ft.touch(i)
		return i, 0, true
	}
	if ft.dir != nil && ft.dir.Fetch(keySum(ft.dir, key)) {
		// Another queue pair holds it (the guest moved the socket to
		// another TX queue): the caller took the frame.
		return 0, dropTaken, false
	}
	proto := addrpolicy.UDP
	if key.kind == flowICMP {
		proto = addrpolicy.ICMP
	}
	v := ft.policy.Outbound(ft.now, proto, key.guestAddr(), netip.AddrPortFrom(key.remoteAddr(), key.remotePort))
	if !v.Allowed() {
		return 0, stats.DropPolicy, false
	}
	if ft.cfg.NoHostSockets {
		ft.st.TX.Drops[stats.DropNoFlow].Add(1)
		return 0, stats.DropNoFlow, false
	}
	if ft.makeRoom(classGuest) {
		// Full: the least recently used flow made room, so a guest that
		// touched many destinations is not locked out for a whole timeout.
		ft.warn("flow table full, oldest flow closed", "max", ft.cfg.MaxFlows)
	}
	var fd int
	var err error
	if key.kind == flowICMP {
		fd, err = ft.openICMP(key, v.Host)
	} else {
		fd, err = ft.openUDP(v.Host)
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
	ft.flows[i].dns = v.DNSForward
	return i, 0, true
}

// adopt makes fd, an open host socket, the guest's flow for key (see
// adoptAs).
func (ft *Table) adopt(key *flowKey, fd int) (int32, bool) { return ft.adoptAs(key, fd, classGuest) }

// dropTaken is lookup's "why" for a datagram the directory took (its flow
// is another pair's): not a drop, nothing to count.
const dropTaken = stats.NumDropReasons

// adoptAs makes fd, an open host socket, the flow for key in class c,
// counted as opened. The table must have a free slot. On failure fd is
// closed.
func (ft *Table) adoptAs(key *flowKey, fd int, c flowClass) (int32, bool) {
	i, ok := ft.place(key, fd, c)
	if !ok {
		unix.Close(fd)
		return 0, false
	}
	ft.st.Flows.Opened[key.kind.proto()].Add(1)
	return i, true
}

// place makes fd the flow for key in class c: a free slot, its class's
// list, the epoll set, the directory. The table must have a free slot. On
// failure (epoll refused it) fd is still the caller's.
func (ft *Table) place(key *flowKey, fd int, c flowClass) (int32, bool) {
	i := ft.free[len(ft.free)-1]
	ft.free = ft.free[:len(ft.free)-1]
	f := &ft.flows[i]
	f.key, f.fd, f.inUse, f.lastUsed, f.class, f.dns, f.fwd = *key, fd, true, ft.now, c, false, -1
	f.gen++
	// Counted before the registration, so that release undoes exactly
	// this when it fails.
	ft.lruAppend(i)
	ft.byKey[*key] = i
	if ft.dir != nil {
		f.fp = keySum(ft.dir, key)
		ft.dir.Add(f.fp)
	}
	ft.live++
	ft.st.Flows.Live[key.kind.proto()].Add(1)
	if ft.ep != nil {
		if err := ft.ep.Add(fd, unix.EPOLLIN|unix.EPOLLET, ft.token(i)); err != nil {
			ft.warn("register flow socket", "err", err)
			ft.release(i)
			return 0, false
		}
	}
	if ft.nextSweep.IsZero() {
		ft.nextSweep = ft.now.Add(ft.sweepInterval())
	}
	return i, true
}

// closeFlow closes flow i's socket and frees its slot, counted as closed.
func (ft *Table) closeFlow(i int32) {
	f := &ft.flows[i]
	if !f.inUse {
		return
	}
	unix.Close(f.fd) // also leaves the epoll set
	ft.st.Flows.Closed[f.key.kind.proto()].Add(1)
	ft.release(i)
}

// release frees flow i's slot; its socket is closed or someone else's now.
func (ft *Table) release(i int32) {
	f := &ft.flows[i]
	f.fd = -1
	f.inUse = false
	ft.lruRemove(i)
	if j, ok := ft.byKey[f.key]; ok && j == i {
		delete(ft.byKey, f.key)
	}
	if ft.dir != nil {
		ft.dir.Remove(f.fp)
	}
	f.fp = 0
	ft.free = append(ft.free, i)
	ft.live--
	ft.st.Flows.Live[f.key.kind.proto()].Add(-1)
}

// proto is the flow counters' protocol of a flow kind.
func (k flowKind) proto() stats.FlowProto {
	if k == flowICMP {
		return stats.FlowICMP
	}
	return stats.FlowUDP
}

// publishCapacity says how many flows of each kind the table holds: the
// guest's share for either kind, and for UDP also the share of forwarded
// ports' peers while the table has forwarded ports.
func (ft *Table) publishCapacity() {
	udp := ft.cfg.MaxFlows
	if ft.NumForwards() > 0 {
		udp += ft.cfg.MaxInboundFlows
	}
	ft.st.Flows.Capacity[stats.FlowUDP].Store(int64(udp))
	ft.st.Flows.Capacity[stats.FlowICMP].Store(int64(ft.cfg.MaxFlows))
}

// CloseFlows closes every flow; forwarded ports stay (the guest is gone, the
// forwards are for the next one).
func (ft *Table) CloseFlows() {
	for i := range ft.flows {
		ft.closeFlow(int32(i))
	}
	ft.rCount = 0
}

func (ft *Table) enqueue(i int32) {
	f := &ft.flows[i]
	if f.queued || ft.rCount == len(ft.readyQ) {
		return
	}
	f.queued = true
	ft.readyQ[(ft.rHead+ft.rCount)%len(ft.readyQ)] = i
	ft.rCount++
}

// Ready handles an epoll event of one of the table's sockets: a flow's
// (hostsock.OwnerUDP, OwnerICMP) or a forwarded port's (OwnerUDPForward).
func (ft *Table) Ready(tok hostsock.Token) {
	if tok.Owner() == hostsock.OwnerUDPForward {
		ft.forwardReady(tok)
		return
	}
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

// Flush delivers queued sockets' data to the guest through w. It returns
// true when work is left that does not depend on the guest (budget used
// up); when the guest's buffers ran out, everything stays queued for the
// refill.
func (ft *Table) Flush(now time.Time, w guestring.Sink) (more bool) {
	ft.now = now
	if ft.fwdPending {
		var blocked bool
		if more, blocked = ft.flushForwards(w); blocked {
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
			r = ft.readUDP(w, i)
		case flowICMP:
			r = ft.readICMP(w, i)
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

func (ft *Table) warn(msg string, args ...any) {
	if ok, _ := ft.warnLimit.Allow(ft.now, time.Second); ok {
		ft.log.Warn(msg, args...)
	}
}

func (ft *Table) nextIPID() uint16 {
	ft.ipID++
	return ft.ipID
}

// openDgram opens a non-blocking datagram socket of proto connected to
// host, where the address policy sends key's remote end.
func (ft *Table) openDgram(host netip.AddrPort, proto int) (int, error) {
	return hostsock.DialDatagram(host, proto, ft.cfg.Source)
}

// Close closes every flow and forwarded port (the Stack is closing).
func (ft *Table) Close() {
	ft.CloseFlows()
	ft.CloseForwards()
}

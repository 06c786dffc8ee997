package dgram

import (
	"log/slog"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
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
	guestUSO  [2]bool          // the guest takes USO frames over IPv4 [0] and IPv6 [1] (VIRTIO_NET_F_GUEST_USO4/6)
	vh        virtqueue.NetHdr // of the frame being committed
	io        hostsock.IO
	rx        udpRecv // the batch receive of UDP flows (udp_recv.go)
	tx        udpSend // the batch send of UDP flows (udp_send.go)
	now       time.Time
	nextSweep time.Time
	ipID      uint16
	warnLimit stats.Limiter
	discard   [65536]byte // datagrams the guest cannot take are read into it
	discardIO [1][]byte

	// Forwarded host UDP ports (pair 0 only), see forward.go; their
	// slots name them in epoll tokens and CloseForward.
	fwd        hostsock.Slots[udpListener]
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
	ft.tx.flow = -1
	ft.publishCapacity()
	return ft
}

// SetGuestCsum records whether the guest takes partial checksums
// (VIRTIO_NET_F_GUEST_CSUM): its datagrams then leave the UDP checksum to it.
func (ft *Table) SetGuestCsum(on bool) { ft.guestCsum = on }

// SetGuestUSO records whether the guest takes UDP segmentation offload
// frames over IPv4 and IPv6 (VIRTIO_NET_F_GUEST_USO4/6): what UDP_GRO
// coalesced on a flow's socket then reaches it as one frame instead of a
// frame per datagram. USO frames carry partial checksums, so without
// SetGuestCsum(true) (which the spec makes a prerequisite, but a front-end
// may not honour) they are never built.
func (ft *Table) SetGuestUSO(v4, v6 bool) { ft.guestUSO = [2]bool{v4, v6} }

// usoTo reports whether frames to the guest over IPv6 (v6) or IPv4 may be
// USO frames.
func (ft *Table) usoTo(v6 bool) bool {
	return ft.guestCsum && ft.guestUSO[b2i(v6)]
}

// b2i is 1 for true, 0 for false: an index by address family.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
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

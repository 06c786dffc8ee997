package tcp

import (
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"

	"vunet/virtqueue"
)

// maxWindow caps the guest window we fill (and the window we advertise):
// with the discard-buffer fallback it is also the discard buffer's size.
const maxWindow = 8 << 20

// maxFramesPerPass bounds the frames one flow reserves per output pass,
// so one connection cannot hog the RX ring and the iovec scratch.
const maxFramesPerPass = 64

// Table holds the TCP connections of one queue pair. It is used only by
// the pair's loop goroutine (no locks); stats.TCP are atomics for metrics.
type Table struct {
	cfg    Config
	newISS func() uint32 // a new connection's initial sequence number (random; tests pick one)
	log    *slog.Logger
	stats  *stats.TCP
	qstats *stats.Queue    // the pair's: policy refusals, frames dropped for the guest
	poll   *hostsock.Epoll // the running loop's; nil between loops

	flows  []conn
	free   []int32 // free slot stack
	byKey  map[connKey]int32
	active []int32 // slots in use, unordered (timers walk it)

	outHead, outTail int32 // flows with output due, FIFO through conn.nextOut

	// peekOff says per host-socket family ([0] AF_INET, [1] AF_INET6)
	// whether SO_PEEK_OFF is used (probed: a kernel may have it for one
	// family only); setPeekOff sets it (tests replace it to play such a
	// kernel). Without it, already-sent bytes are peeked into discard.
	peekOff    [2]bool
	setPeekOff func(fd, off int) error
	discard    []byte

	// Offloads the guest negotiated (set from virtio features).
	guestCsum, tso4, tso6 bool

	// The guest's TX ring size in descriptors, for the window budget (0:
	// none; ring_budget.go), and the connections sharing it.
	txRing  int
	senders senderCount

	nextTimer time.Time // earliest deadline of any flow, zero: none
	// timerOwner is the slot of the flow whose deadline nextTimer is (-1:
	// another's, or none); timerStale says that flow has since moved its
	// deadline later or gone (timer_next.go).
	timerOwner int32
	timerStale bool

	// clampNeeded: this kernel needs the window workaround (reopenWindow).
	clampNeeded bool

	// Forwarded ports (their slots name them in epoll tokens and
	// Unlisten) and the guest they forward to.
	listeners hostsock.Slots[listener]
	// acceptRetry is when masked listeners are retried (zero: none is
	// masked), acceptDelay the back-off that set it (accept_backoff.go).
	acceptRetry      time.Time
	acceptDelay      time.Duration
	acceptLog        stats.Limiter
	guestMAC         [6]byte
	guestV4, guestV6 netip.Addr
	// The configured guest (SetGuestDefaults), for what is not learned.
	defaultMAC           [6]byte
	defaultV4, defaultV6 netip.Addr

	// policy decides which guest connections may be made, and to where.
	policy stats.PolicyGate

	// Buffers of out-of-order guest data (outoforder.go): the pool and
	// how many are out; the iovecs that write one.
	oooPool []*oooBuf
	oooLive int
	oooIov  [2][]byte
	opts    header.TCPOptions              // of the flag frame being built
	optBuf  [header.TCPMaxOptionsSize]byte // its encoding

	// dir shares the connections with the other queue pairs' tables
	// (directory.go); nil: this table is alone.
	dir Directory

	// dial opens the host socket; tests and fuzzing replace it.
	dial func(dst netip.AddrPort, sndBuf, rcvBuf int) (fd int, inProgress bool, err error)

	io   hostsock.IO
	info unix.TCPInfo // TCP_INFO as last read
	// connectInfo is the TCP_INFO settleLocalConnect read, which the
	// SYN-ACK of the same output pass takes instead of reading it again
	// (syscall_hints.go); connectInfoFor names its connection (the zero
	// flowRef: none).
	connectInfo    unix.TCPInfo
	connectInfoFor flowRef

	// reads, infoReads, memReads and epollCtls count the peeks, the
	// TCP_INFO reads, the SO_MEMINFO reads and the epoll_ctl calls for
	// connections, which the hints of syscall_hints.go save (tests read
	// them).
	reads, infoReads, memReads, epollCtls uint64
	// gatherWrites counts the runs of guest data written (send_gather.go).
	gatherWrites uint64
	gather       sendGather
	// consumeQ names the connections with bytes to consume at the
	// batch's end (consume.go), each once; consumes counts the receives.
	consumeQ []flowRef
	consumes uint64
	// epollQ names the connections whose epoll mask changes at the end of
	// the iteration (SyncEpoll), each once.
	epollQ []flowRef
	seg    segment
	// sackIn is the SACK blocks of the guest ACK being handled
	// (sack_recovery.go).
	sackIn sackView
	rsts   [rstQueueLen]pendingRST
	nrst   int
	vh     virtqueue.NetHdr // fields of the frame being committed
	frm    [maxFramesPerPass]reservedFrame
	bufs   [][]byte // payload iovecs of the reserved frames, in order
}

// reservedFrame is one reserved frame during an output pass.
type reservedFrame struct {
	hdr    []byte
	first  int // index into Table.bufs
	nbufs  int
	capLen int
}

// New allocates a table of cfg.MaxFlows connections counting into st, and
// into qs its flows and what the address policy refuses. st and qs may be
// nil (private sets are used). Attach gives it a loop's epoll set.
func New(cfg Config, st *stats.TCP, qs *stats.Queue) *Table {
	cfg.setDefaults()
	if st == nil {
		st = new(stats.TCP)
	}
	if qs == nil {
		qs = new(stats.Queue)
	}
	if cfg.Policy == nil {
		cfg.Policy = addrpolicy.New(addrpolicy.Config{}) // nothing is allowed
	}
	t := &Table{
		cfg:        cfg,
		newISS:     rand.Uint32,
		log:        cfg.Logger,
		stats:      st,
		qstats:     qs,
		flows:      make([]conn, cfg.MaxFlows),
		free:       make([]int32, 0, cfg.MaxFlows),
		byKey:      make(map[connKey]int32, cfg.MaxFlows),
		active:     make([]int32, 0, cfg.MaxFlows),
		outHead:    -1,
		outTail:    -1,
		timerOwner: -1,
		peekOff: [2]bool{
			!cfg.NoPeekOffset && hostsock.PeekOffsetSupported(false),
			!cfg.NoPeekOffset && hostsock.PeekOffsetSupported(true),
		},
		setPeekOff: hostsock.SetPeekOffset,
		bufs:       make([][]byte, 0, hostsock.MaxIovecs),
		consumeQ:   make([]flowRef, 0, cfg.MaxFlows),
		epollQ:     make([]flowRef, 0, cfg.MaxFlows),
		oooPool:    make([]*oooBuf, 0, oooMaxBuffers),
		dial:       dialer(cfg.Source),
		policy:     stats.PolicyGate{Policy: cfg.Policy, Stats: qs, Log: cfg.Logger},
	}
	for i := cfg.MaxFlows - 1; i >= 0; i-- {
		t.flows[i].slot = int32(i)
		t.flows[i].fd = -1
		t.flows[i].nextOut = -1
		t.free = append(t.free, int32(i))
	}
	if !t.peekOff[0] || !t.peekOff[1] {
		t.discard = make([]byte, maxWindow)
	}
	if !cfg.NoWindowClamp {
		k := hostsock.ProbeWindowKernel()
		t.clampNeeded = k.NeedsClamp()
		windowProbeLog.Do(func() {
			cfg.Logger.Info("tcp window workaround (TCP_WINDOW_CLAMP after a guest ACK of a stalled connection)",
				"applied", t.clampNeeded, "probe", k.String())
		})
	}
	t.qstats.Flows.Capacity[stats.FlowTCP].Store(int64(cfg.MaxFlows))
	return t
}

// SetFeatures records the guest's offload features (virtio-net feature
// bits): checksum offload lets frames carry a partial checksum, TSO lets
// them exceed the MTU as GSO frames.
func (t *Table) SetFeatures(guestCsum, tso4, tso6 bool) {
	t.guestCsum, t.tso4, t.tso6 = guestCsum, tso4 && guestCsum, tso6 && guestCsum
}

// SetMTU changes the guest MTU for frames built from now on.
func (t *Table) SetMTU(mtu int) {
	if mtu > 0 {
		t.cfg.MTU = mtu
	}
}

// Len returns the number of live connections.
func (t *Table) Len() int { return len(t.active) }

// Close resets every connection's host socket and frees the table's slots
// (loop shutdown for good, not a pair restart).
func (t *Table) Close() {
	t.CloseListeners()
	t.ResetConnections()
}

// ResetConnections closes every connection with an RST to its host peer and
// keeps the listeners of forwarded ports: the guest that owned the
// connections is gone, the forwards stay for the next one.
func (t *Table) ResetConnections() {
	for len(t.active) > 0 {
		f := &t.flows[t.active[len(t.active)-1]]
		if f.state != stats.TCPResetting {
			t.stats.Resets[stats.TCPSessionEnd].Add(1)
		}
		t.closeSocket(f, true)
		t.release(f)
	}
}

// markDirty queues f for the next output pass.
func (t *Table) markDirty(f *conn) {
	if f.flags&flDirty != 0 {
		return
	}
	f.flags |= flDirty
	f.nextOut = -1
	if t.outTail < 0 {
		t.outHead = f.slot
	} else {
		t.flows[t.outTail].nextOut = f.slot
	}
	t.outTail = f.slot
}

// dialer returns the function the table opens host sockets with.
func dialer(src hostsock.Source) func(dst netip.AddrPort, sndBuf, rcvBuf int) (int, bool, error) {
	return func(dst netip.AddrPort, sndBuf, rcvBuf int) (int, bool, error) {
		return hostsock.DialTCP(dst, src, sndBuf, rcvBuf)
	}
}

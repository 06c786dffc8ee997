package tcp

import (
	"log/slog"
	"net/netip"
	"sync"
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

	// clampNeeded: this kernel needs the window workaround (reopenWindow).
	clampNeeded bool

	// Forwarded ports and the guest they forward to; freeListeners are
	// the slots of closed ones.
	listeners     []listener
	freeListeners []int
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
	seg  segment
	rsts [rstQueueLen]pendingRST
	nrst int
	vh   virtqueue.NetHdr // fields of the frame being committed
	frm  [maxFramesPerPass]reservedFrame
	bufs [][]byte // payload iovecs of the reserved frames, in order
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
		cfg:     cfg,
		log:     cfg.Logger,
		stats:   st,
		qstats:  qs,
		flows:   make([]conn, cfg.MaxFlows),
		free:    make([]int32, 0, cfg.MaxFlows),
		byKey:   make(map[connKey]int32, cfg.MaxFlows),
		active:  make([]int32, 0, cfg.MaxFlows),
		outHead: -1,
		outTail: -1,
		peekOff: [2]bool{
			!cfg.NoPeekOffset && hostsock.PeekOffsetSupported(false),
			!cfg.NoPeekOffset && hostsock.PeekOffsetSupported(true),
		},
		setPeekOff: hostsock.SetPeekOffset,
		bufs:       make([][]byte, 0, hostsock.MaxIovecs),
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

// windowProbeLog says once per process what the window probe found.
var windowProbeLog sync.Once

// ProbeKernel runs now, once per process, the kernel probes tables built
// with cfg depend on (SO_PEEK_OFF per address family; the window
// experiment unless cfg.NoWindowClamp), so that a daemon runs them at
// start-up, before it confines itself, instead of at its first queue
// pair start.
func ProbeKernel(cfg Config) {
	if !cfg.NoPeekOffset {
		hostsock.PeekOffsetSupported(false)
		hostsock.PeekOffsetSupported(true)
	}
	if !cfg.NoWindowClamp {
		hostsock.ProbeWindowKernel()
	}
}

// usePeekOffset starts f's socket reading at SO_PEEK_OFF when its family
// has it (f.peekOff), and otherwise leaves f on the discard-buffer
// fallback: a family whose probe failed, or a socket that refuses it all
// the same, costs a copy per peek, never the connection.
func (t *Table) usePeekOffset(f *conn) {
	f.peekOff = false
	fam := 0
	if hostsock.SocketIsIPv6(f.fd) {
		fam = 1
	}
	if !t.peekOff[fam] {
		return
	}
	if err := t.setPeekOff(f.fd, 0); err != nil {
		t.log.Debug("tcp SO_PEEK_OFF refused: discard-buffer fallback for this connection", "err", err)
		return
	}
	f.peekOff = true
}

// discardBuf returns the fallback's discard buffer, allocated on first
// use where every family had SO_PEEK_OFF.
func (t *Table) discardBuf() []byte {
	if t.discard == nil {
		t.discard = make([]byte, maxWindow)
	}
	return t.discard
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

// Attach sets the poller and registers every open socket with it: the loop
// calls it after building a new epoll set (queue pair restart), so
// connections survive the control plane's ring rebuilds.
func (t *Table) Attach(p *hostsock.Epoll) {
	t.poll = p
	for _, s := range t.active {
		f := &t.flows[s]
		if f.fd < 0 || !f.inEpoll {
			continue
		}
		f.inEpoll = p.Add(f.fd, f.epollEvents, t.token(f)) == nil
	}
	// A new loop retries masked listeners at once.
	t.acceptRetry = time.Time{}
	for i := range t.listeners {
		l := &t.listeners[i]
		if l.fd < 0 {
			continue
		}
		l.masked = false
		if err := p.Add(l.fd, unix.EPOLLIN, t.listenerToken(i)); err != nil {
			t.log.Warn("tcp forward: epoll add failed", "err", err)
		}
	}
}

// Detach forgets the poller: the loop calls it when it stops (its epoll set
// is closed with it, which drops every registration). Sockets stay open and
// Attach registers them with the next loop's set.
func (t *Table) Detach() { t.poll = nil }

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

func (t *Table) token(f *conn) hostsock.Token {
	return hostsock.NewToken(hostsock.OwnerTCP, f.gen, uint32(f.slot))
}

// flowByToken resolves an epoll token; nil for a stale one.
func (t *Table) flowByToken(tok hostsock.Token) *conn {
	slot := tok.Slot()
	if int(slot) >= len(t.flows) {
		return nil
	}
	f := &t.flows[slot]
	if f.state == stats.TCPFree || f.gen&hostsock.GenMask != tok.Gen() {
		return nil
	}
	return f
}

func (t *Table) setState(f *conn, s stats.TCPState) {
	if f.state == s {
		return
	}
	if f.state != stats.TCPFree {
		t.stats.ConnsByState[f.state].Add(-1)
	}
	if s != stats.TCPFree {
		t.stats.ConnsByState[s].Add(1)
	}
	f.state = s
}

// alloc takes a free slot for key; nil when the table is full.
func (t *Table) alloc(key connKey) *conn {
	if len(t.free) == 0 {
		return nil
	}
	s := t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	f := &t.flows[s]
	gen := f.gen + 1
	*f = conn{key: key, fd: -1, slot: s, gen: gen, nextOut: -1}
	if t.dir != nil {
		f.fp = keySum(t.dir, &key)
		t.dir.Add(f.fp)
	}
	t.byKey[key] = s
	t.active = append(t.active, s)
	t.qstats.Flows.Live[stats.FlowTCP].Add(1)
	return f
}

// release returns f's slot. The socket must be closed already, and f must
// not be in the output list (output passes skip free slots anyway).
func (t *Table) release(f *conn) {
	if f.state == stats.TCPFree {
		return
	}
	t.qstats.Flows.Closed[stats.FlowTCP].Add(1)
	t.freeSlot(f)
}

// handedOff returns the slot of a connection another table took over,
// counted as moved out.
func (t *Table) handedOff(f *conn) {
	if f.state == stats.TCPFree {
		return
	}
	t.qstats.Flows.MovedOut[stats.FlowTCP].Add(1)
	t.freeSlot(f)
}

// freeSlot is release without the count.
func (t *Table) freeSlot(f *conn) {
	if s, ok := t.byKey[f.key]; ok && s == f.slot {
		delete(t.byKey, f.key)
	}
	if t.dir != nil {
		t.dir.Remove(f.fp)
	}
	f.fp = 0
	t.oooDrop(f)
	for i, s := range t.active {
		if s == f.slot {
			last := len(t.active) - 1
			t.active[i] = t.active[last]
			t.active = t.active[:last]
			break
		}
	}
	t.clearStalled(f)
	t.setState(f, stats.TCPFree)
	t.qstats.Flows.Live[stats.FlowTCP].Add(-1)
	f.gen++
	if f.flags&flDirty == 0 {
		t.free = append(t.free, f.slot)
	}
	// A dirty flow's slot is returned when the output pass unlinks it, so
	// the list never points at a reused slot.
}

// closeSocket removes f's socket from epoll and closes it; with reset the
// host peer sees RST.
func (t *Table) closeSocket(f *conn, reset bool) {
	if f.fd < 0 {
		return
	}
	if f.inEpoll && t.poll != nil {
		_ = t.poll.Del(f.fd)
	}
	f.inEpoll = false
	f.epollEvents = 0
	if reset {
		hostsock.CloseWithReset(f.fd)
	} else {
		unix.Close(f.fd)
	}
	f.fd = -1
	if !t.acceptRetry.IsZero() {
		t.unmaskListeners() // a descriptor came free
	}
}

// resetFlow closes the host socket with RST and schedules an RST to the
// guest, counted by why; the slot is released once the RST is out.
func (t *Table) resetFlow(f *conn, now time.Time, why stats.TCPReason) {
	t.stats.Resets[why].Add(1)
	t.abortFlow(f, now)
}

// connectFailed ends a guest connection whose host connect() failed, as
// resetFlow does, counted as a connect failure.
func (t *Table) connectFailed(f *conn, now time.Time, why stats.TCPReason) {
	t.stats.ConnectFailures[why].Add(1)
	t.abortFlow(f, now)
}

// abortFlow closes the host socket with RST and schedules an RST to the
// guest; the slot is released once the RST is out.
func (t *Table) abortFlow(f *conn, now time.Time) {
	t.closeSocket(f, true)
	f.flags |= flRstDue
	f.lastActivity = now // the deadline for getting the RST out runs from here
	t.setState(f, stats.TCPResetting)
	t.markDirty(f)
}

// dropFlow forgets f at once: no frame to the guest (it reset, or the
// connection finished cleanly).
func (t *Table) dropFlow(f *conn, reset bool) {
	t.closeSocket(f, reset)
	t.release(f)
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

// updateEpoll registers the events f's state calls for.
//
// Once connected, a socket is always watched edge-triggered. Data stays
// queued in the socket until the guest ACKs it, EOF and hang-up stay
// readable forever, and send space is often plentiful while the window we
// may advertise is not: level-triggered readiness would spin the loop in
// every one of those cases. Edges are enough because nothing here relies on
// epoll to be told twice: an output pass reads everything it has room for,
// and every other reason to stop reading has its own trigger (a guest ACK
// or window update, an RX refill, a timer), which reads directly.
//
// Reading follows DESIGN invariant 4: a flow stalled on the guest's window,
// or waiting for RX buffers, does not watch EPOLLIN at all; a flow stalled
// because everything readable is in flight watches it for new data.
func (t *Table) updateEpoll(f *conn) {
	if f.fd < 0 || t.poll == nil {
		return
	}
	var ev uint32
	switch {
	case f.flags&flConnected == 0:
		ev = unix.EPOLLOUT // connect() completion, once
	case f.state == stats.TCPSynSent:
		ev = unix.EPOLLET // the guest has not accepted yet: read once established
	case f.has(evGuestFinSent):
		ev = unix.EPOLLET // nothing more to read; ERR and HUP are always reported
	case f.flags&flRxBlocked != 0, f.flags&flStalled != 0 && f.flags&flWndStall != 0:
		ev = unix.EPOLLET
	default:
		ev = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET
	}
	if f.flags&flWantOut != 0 {
		ev |= unix.EPOLLOUT
	}
	// EPOLLERR and EPOLLHUP are always reported; a zero mask still keeps the
	// fd registered for them.
	if f.inEpoll && f.epollEvents == ev {
		return
	}
	var err error
	if !f.inEpoll {
		err = t.poll.Add(f.fd, ev, t.token(f))
	} else {
		err = t.poll.Mod(f.fd, ev, t.token(f))
	}
	if err != nil {
		t.log.Debug("tcp epoll update failed", "fd", f.fd, "err", err)
		return
	}
	f.inEpoll = true
	f.epollEvents = ev
}

// noteTimer lowers the table's next deadline to d.
func (t *Table) noteTimer(d time.Time) {
	if d.IsZero() {
		return
	}
	if t.nextTimer.IsZero() || d.Before(t.nextTimer) {
		t.nextTimer = d
	}
}

// NextTimer returns the earliest deadline of any connection; zero means
// none. The loop arms its timerfd to it after each iteration and calls
// Timers when it fires.
func (t *Table) NextTimer() time.Time { return t.nextTimer }

// dialer returns the function the table opens host sockets with.
func dialer(src hostsock.Source) func(dst netip.AddrPort, sndBuf, rcvBuf int) (int, bool, error) {
	return func(dst netip.AddrPort, sndBuf, rcvBuf int) (int, bool, error) {
		return hostsock.DialTCP(dst, src, sndBuf, rcvBuf)
	}
}

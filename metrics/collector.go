package metrics

import (
	"math/bits"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/stats"
	"vunet/vhostuser"
	"vunet/virtqueue"
)

// Sources are the counters a collector reads. Nil sources are skipped.
type Sources struct {
	// QueuePairs is the number of queue pairs offered.
	QueuePairs int
	// Control holds the vhost-user counters and the per-ring virtqueue stats.
	Control *vhostuser.Stats
	// PairStats returns the data-path counters of a queue pair, nil for a
	// pair that never ran. Usually tcpstack.Stack.PairStats.
	PairStats func(pair int) *stats.Queue
	// PairTCPStats returns the TCP translation counters of a queue pair,
	// nil for a pair that never ran. Usually tcpstack.Stack.PairTCPStats.
	PairTCPStats func(pair int) *stats.TCP
	// Forwards counts the forwarded host ports. Usually
	// tcpstack.Stack.ForwardStats.
	Forwards *stats.Forwards
	// DNSForward says a DNS forward is configured: its counters are
	// exported (they stay zero without one).
	DNSForward bool
	// Build is exported as vunet_build_info.
	Build BuildInfo
}

// zeroPair and zeroTCP stand in for queue 0 before it first runs.
var (
	zeroPair stats.Queue
	zeroTCP  stats.TCP
)

// collector reads Sources at scrape time.
type collector struct{ src Sources }

// NewCollector returns a Prometheus collector over src.
func NewCollector(src Sources) prometheus.Collector { return &collector{src: src} }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range families {
		ch <- f.desc
	}
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

// sparseCounter emits a series only once it has counted something. It is
// for families labelled by reason: of 16 drop reasons × 2 directions most
// cannot happen in a given direction, and series that are zero forever
// cost every scrape and every dashboard.
func sparseCounter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	if v != 0 {
		counter(ch, d, v, labels...)
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

// Collect emits only label combinations that can happen. A queue pair's
// series appear once the pair has run (queue 0's from the start, so a
// dashboard has series before the guest boots): a guest that enables 4 of
// 128 offered pairs shows 4 queues, not 128. A queue's series never vanish
// after that; its counters survive ring rebuilds and reconnects.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	b := c.src.Build
	gauge(ch, descBuildInfo, 1, b.Version, b.Revision, b.GoVersion)
	pairs := max(c.src.QueuePairs, 1)
	for p := 0; p < pairs && p < vhostuser.MaxQueuePairs; p++ {
		var st *stats.Queue
		var tcp *stats.TCP
		if c.src.PairStats != nil {
			st = c.src.PairStats(p)
		}
		if c.src.PairTCPStats != nil {
			tcp = c.src.PairTCPStats(p)
		}
		var rx, tx *virtqueue.Stats
		if c.src.Control != nil {
			rx, tx = &c.src.Control.Rings[2*p], &c.src.Control.Rings[2*p+1]
		}
		if p > 0 && st == nil && tcp == nil && ringIdle(rx) && ringIdle(tx) {
			continue
		}
		q := strconv.Itoa(p)
		if rx != nil {
			collectRing(ch, rx, q, dirToGuest)
			collectRing(ch, tx, q, dirFromGuest)
		}
		if c.src.PairStats != nil {
			if st == nil {
				st = &zeroPair
			}
			collectPair(ch, st, q, c.src.DNSForward)
		}
		if c.src.PairTCPStats != nil {
			if tcp == nil {
				tcp = &zeroTCP
			}
			collectTCP(ch, tcp, q, c.src.DNSForward)
		}
	}
	if f := c.src.Forwards; f != nil {
		for _, p := range []stats.FlowProto{stats.FlowTCP, stats.FlowUDP} {
			gauge(ch, descFwdPorts, float64(f.Ports[p].Load()), p.String())
			counter(ch, descFwdBindFail, f.BindFailures[p].Load(), p.String())
		}
	}
	if s := c.src.Control; s != nil {
		for r := vhostuser.Request(0); r < vhostuser.NumRequests; r++ {
			sparseCounter(ch, descMessages, s.MessageCount(r), r.String())
		}
		for r := vhostuser.ErrorReason(0); r < vhostuser.NumErrorReasons; r++ {
			counter(ch, descErrors, s.ErrorCount(r), r.String())
		}
		gauge(ch, descConnected, float64(s.Connected.Load()))
		counter(ch, descSessions, s.Sessions.Load())
		gauge(ch, descGuestMem, float64(s.GuestMemory.Load()))
		eachBit(s.Features.Load(), func(b int) { gauge(ch, descFeature, 1, strconv.Itoa(b)) })
		eachBit(s.ProtocolFeatures.Load(), func(b int) { gauge(ch, descProtoFeat, 1, strconv.Itoa(b)) })
	}
}

// ringIdle reports whether a ring has counted nothing (or does not exist).
func ringIdle(st *virtqueue.Stats) bool {
	return st == nil || st.Notifies.Load()|st.NotifiesSuppressed.Load()|st.Kicks.Load()|st.BadChains.Load() == 0
}

func collectRing(ch chan<- prometheus.Metric, st *virtqueue.Stats, q, dir string) {
	counter(ch, descNotify, st.Notifies.Load(), q, dir)
	counter(ch, descSuppressed, st.NotifiesSuppressed.Load(), q, dir)
	counter(ch, descKicks, st.Kicks.Load(), q, dir)
	counter(ch, descBadChains, st.BadChains.Load(), q, dir)
	// Zero until the guest is first migrated: no series before.
	sparseCounter(ch, descDirtyLog, st.DirtyLogWrites.Load(), q, dir)
	sparseCounter(ch, descDirtyMiss, st.DirtyLogMisses.Load(), q, dir)
}

func collectPair(ch chan<- prometheus.Metric, st *stats.Queue, q string, dnsForward bool) {
	for _, d := range []struct {
		name string
		s    *stats.Dir
	}{{dirFromGuest, &st.TX}, {dirToGuest, &st.RX}} {
		counter(ch, descFrames, d.s.Frames.Load(), q, d.name)
		counter(ch, descBytes, d.s.Bytes.Load(), q, d.name)
		counter(ch, descBatches, d.s.Batches.Load(), q, d.name)
		for r := stats.DropReason(0); r < stats.NumDropReasons; r++ {
			sparseCounter(ch, descDrops, d.s.Drops[r].Load(), q, d.name, r.String())
		}
	}
	counter(ch, descDescWaits, st.RXWaitedForDescriptors.Load(), q)
	counter(ch, descWasted, st.RXChainsWasted.Load(), q)
	counter(ch, descWakeups, st.Wakeups.Load(), q)
	sparseCounter(ch, descLoopPolls, st.PollHits.Load(), q, "hit")
	sparseCounter(ch, descLoopPolls, st.PollMisses.Load(), q, "miss")
	counter(ch, descLoopStarts, st.LoopStarts.Load(), q)
	counter(ch, descMemFaults, st.MemoryFaults.Load(), q)
	for p := addrpolicy.Proto(0); p < addrpolicy.NumProtos; p++ {
		for r := addrpolicy.Reason(1); r < addrpolicy.NumReasons; r++ { // 0 is "allowed"
			sparseCounter(ch, descPolicy, st.PolicyDrops[p][r].Load(), q, p.String(), r.String())
		}
	}
	fl := &st.Flows
	for p := stats.FlowProto(0); p < stats.NumFlowProtos; p++ {
		gauge(ch, descFlows, float64(fl.Live[p].Load()), q, p.String())
		gauge(ch, descFlowCap, float64(fl.Capacity[p].Load()), q, p.String())
		counter(ch, descFlowsOpen, fl.Opened[p].Load(), q, p.String())
		counter(ch, descFlowsClose, fl.Closed[p].Load(), q, p.String())
		if p != stats.FlowTCP { // TCP refuses a SYN rather than evict
			counter(ch, descFlowsEvict, fl.Evicted[p].Load(), q, p.String())
		}
	}
	if dnsForward {
		counter(ch, descDNSFwdUDP, st.Proto.DNSForwardDatagrams.Load(), q)
	}
	for p := stats.FlowProto(0); p < stats.NumFlowProtos; p++ {
		sparseCounter(ch, descFlowMoves, fl.MovedIn[p].Load(), q, p.String(), "in")
		sparseCounter(ch, descFlowMoves, fl.MovedOut[p].Load(), q, p.String(), "out")
	}
	sparseCounter(ch, descFetches, st.FlowFetches.Load(), q)
	sparseCounter(ch, descFetchMiss, st.FlowFetchMisses.Load(), q)
	for e := stats.EtherClass(0); e < stats.NumEtherClasses; e++ {
		counter(ch, descEther, st.TXByEtherType[e].Load(), q, e.String())
	}
	for s := stats.Service(0); s < stats.NumServices; s++ {
		counter(ch, descService, st.ServiceReplies[s].Load(), q, s.String())
	}
	collectProto(ch, &st.Proto, q)
	collectStream(ch, &st.Stream, q)
}

// collectStream exports the stream transport's counters, all sparse: a
// vhost-user back-end has none.
func collectStream(ch chan<- prometheus.Metric, s *stats.Stream, q string) {
	sparseCounter(ch, descStreamSessions, s.Sessions.Load(), q)
	sparseCounter(ch, descStreamCalls, s.Reads.Load(), q, dirFromGuest)
	sparseCounter(ch, descStreamCalls, s.Writes.Load(), q, dirToGuest)
	sparseCounter(ch, descStreamBytes, s.ReadBytes.Load(), q, dirFromGuest)
	sparseCounter(ch, descStreamBytes, s.WriteBytes.Load(), q, dirToGuest)
	sparseCounter(ch, descStreamWaits, s.WriteWaits.Load(), q)
	sparseCounter(ch, descStreamCloses, s.BadLength.Load(), q, "bad_length")
	sparseCounter(ch, descStreamCloses, s.Truncated.Load(), q, "truncated")
	sparseCounter(ch, descStreamCloses, s.WriteErrors.Load(), q, "write_error")
}

func collectProto(ch chan<- prometheus.Metric, p *stats.Proto, q string) {
	for d := stats.FlowDir(0); d < stats.NumFlowDirs; d++ {
		counter(ch, descUDPDatagrams, p.UDPDatagrams[d].Load(), q, d.String())
		counter(ch, descUDPBytes, p.UDPBytes[d].Load(), q, d.String())
		sparseCounter(ch, descUDPUSOFrames, p.UDPUSOFrames[d].Load(), q, d.String())
		for r := stats.DropReason(0); r < stats.NumDropReasons; r++ {
			sparseCounter(ch, descUDPDrops, p.UDPDrops[d][r].Load(), q, d.String(), r.String())
		}
	}
	counter(ch, descEchoReq, p.ICMPEchoRequests.Load(), q)
	counter(ch, descEchoRep, p.ICMPEchoReplies.Load(), q)
	counter(ch, descLeases, p.DHCPLeases.Load(), q, "dhcp")
	counter(ch, descLeases, p.DHCPv6Leases.Load(), q, "dhcpv6")
	counter(ch, descNDPSent, p.RouterAdverts.Load(), q, "router_advert")
	counter(ch, descNDPSent, p.NeighborAdverts.Load(), q, "neighbor_advert")
	for o := stats.FragOutcome(0); o < stats.NumFragOutcomes; o++ {
		counter(ch, descFragments, p.Fragments[o].Load(), q, o.String())
	}
}

func collectTCP(ch chan<- prometheus.Metric, st *stats.TCP, q string, dnsForward bool) {
	// State 0 is a free slot, not a connection.
	for i := 1; i < len(st.ConnsByState); i++ {
		gauge(ch, descTCPConns, float64(st.ConnsByState[i].Load()), q, stats.TCPStateName(i))
	}
	counter(ch, descTCPConnects, st.Connects.Load(), q)
	// Each reason counter exports the reasons that can happen to it.
	for _, r := range stats.TCPConnectFailReasons {
		counter(ch, descTCPConnFail, st.ConnectFailures[r].Load(), q, r.String())
	}
	counter(ch, descTCPAccepted, st.Accepted.Load(), q)
	for _, r := range stats.TCPAcceptRefusalReasons {
		counter(ch, descTCPRefusals, st.AcceptRefusals[r].Load(), q, r.String())
	}
	counter(ch, descTCPBackoffs, st.AcceptBackoffs.Load(), q)
	for _, r := range stats.TCPResetReasons {
		counter(ch, descTCPResets, st.Resets[r].Load(), q, r.String())
	}
	counter(ch, descTCPStalls, st.Stalls.Load(), q)
	gauge(ch, descTCPStalled, float64(st.Stalled.Load()), q)
	// On the kernels measured the window workaround is never needed:
	// its series appear only where it runs.
	sparseCounter(ch, descTCPClamps, st.ClampAttempts.Load(), q)
	sparseCounter(ch, descTCPClampsEff, st.ClampEffective.Load(), q)
	sparseCounter(ch, descTCPProbes, st.WindowProbes.Load(), q)
	sparseCounter(ch, descTCPChallenge, st.ChallengeAcksLimited.Load(), q)
	for c := stats.TCPRetransCause(0); c < stats.NumTCPRetransCauses; c++ {
		if c == stats.TCPRetransWindow {
			sparseCounter(ch, descTCPRetrans, st.Retransmits[c].Load(), q, c.String())
			continue
		}
		counter(ch, descTCPRetrans, st.Retransmits[c].Load(), q, c.String())
	}
	sparseCounter(ch, descTCPOOO, st.OutOfOrderKept.Load(), q)
	sparseCounter(ch, descTCPOOOFull, st.OutOfOrderNoBuffer.Load(), q)
	counter(ch, descTCPRSTSent, st.RSTSent.Load(), q)
	counter(ch, descTCPRSTRecv, st.RSTReceived.Load(), q)
	counter(ch, descTCPBytes, st.BytesToGuest.Load(), q, dirToGuest)
	counter(ch, descTCPBytes, st.BytesFromGuest.Load(), q, dirFromGuest)
	if dnsForward {
		counter(ch, descDNSFwdTCP, st.DNSForwardConnects.Load(), q)
	}
}

func eachBit(v uint64, fn func(bit int)) {
	for v != 0 {
		b := bits.TrailingZeros64(v)
		fn(b)
		v &^= 1 << b
	}
}

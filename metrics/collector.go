package metrics

import (
	"math/bits"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"vunet/tcpstack"
	"vunet/vhostuser"
	"vunet/virtqueue"
)

// Sources are the counters a collector reads. Nil sources are skipped.
type Sources struct {
	// QueuePairs is the number of queue pairs offered; their rings are
	// reported even before a front-end connects, so series do not appear
	// and vanish with sessions.
	QueuePairs int
	// Control holds the vhost-user counters and the per-ring virtqueue stats.
	Control *vhostuser.Stats
	// PairStats returns the data-path counters of a queue pair, nil for a
	// pair that never ran (reported as zeros). Usually tcpstack.Stack.PairStats.
	PairStats func(pair int) *tcpstack.QueueStats
	// PairTCPStats returns the TCP translation counters of a queue pair,
	// nil for a pair that never ran. Usually tcpstack.Stack.PairTCPStats.
	PairTCPStats func(pair int) *tcpstack.TCPStats
}

// zeroPair stands in for pairs that never ran.
var (
	zeroPair tcpstack.QueueStats
	zeroTCP  tcpstack.TCPStats
)

const namespace = "vunet"

// allDescs is every descriptor desc made, in declaration order: Describe
// sends them all, so a new metric cannot be left out of it by hand.
var allDescs []*prometheus.Desc

func desc(name, help string, labels ...string) *prometheus.Desc {
	d := prometheus.NewDesc(namespace+"_"+name, help, labels, nil)
	allDescs = append(allDescs, d)
	return d
}

var (
	queueLabels = []string{"queue", "direction"}

	descFrames     = desc("queue_frames_total", "Ethernet frames moved through a queue (tx: from the guest, rx: placed in used descriptors).", queueLabels...)
	descBytes      = desc("queue_bytes_total", "Ethernet bytes moved through a queue, virtio-net header excluded.", queueLabels...)
	descBatches    = desc("queue_batches_total", "Used-ring publications (one per batch of frames).", queueLabels...)
	descDrops      = desc("queue_drops_total", "Frames dropped by the data path, by reason.", "queue", "direction", "reason")
	descNotify     = desc("queue_notifications_total", "Interrupts sent to the guest (call eventfd writes).", queueLabels...)
	descSuppressed = desc("queue_notifications_suppressed_total", "Used-ring publications that needed no interrupt (EVENT_IDX or NO_INTERRUPT).", queueLabels...)
	descKicks      = desc("queue_kicks_total", "Guest kicks read from the kick eventfd (coalesced).", queueLabels...)
	descBadChains  = desc("queue_bad_chains_total", "Malformed descriptor chains returned to the guest with length 0.", queueLabels...)
	descRXWaited   = desc("queue_rx_waited_for_descriptors_total", "Frames for the guest that found no RX descriptor and waited for a refill.", "queue")
	descTXEther    = desc("queue_tx_frames_by_ethertype_total", "Frames from the guest by ethertype class.", "queue", "ethertype")
	descRXWasted   = desc("queue_rx_chains_wasted_total", "RX chains returned to the guest empty (could be neither used nor rewound).", "queue")
	descWakeups    = desc("queue_loop_wakeups_total", "Event-loop returns from epoll_wait.", "queue")
	descLoopStarts = desc("queue_loop_starts_total", "Starts of the queue pair's event loop (ring rebuilds, reconnects).", "queue")
	descMemFaults  = desc("queue_memory_faults_total", "Event loops stopped by a fault on guest memory (front-end shrank its memory file).", "queue")
	descFlowsOpen  = desc("flows_opened_total", "UDP and ICMP echo flows opened (one host socket each).", "queue")
	descFlowsClose = desc("flows_closed_total", "UDP and ICMP echo flows closed.", "queue")
	descFlowsEvict = desc("flows_evicted_total", "Flows closed early to make room in a full flow table.", "queue")
	descService    = desc("service_replies_total", "Frames produced by the link services (ARP, DHCP, DHCPv6, NDP).", "queue", "service")

	descUDPFlows     = desc("udp_flows", "Live UDP flows (one host socket each).", "queue")
	descICMPFlows    = desc("icmp_flows", "Live ICMP echo flows (one ping socket each).", "queue")
	descUDPDatagrams = desc("udp_datagrams_total", "UDP datagrams translated (to_guest: delivered to the guest, from_guest: sent from a host socket).", "queue", "direction")
	descUDPBytes     = desc("udp_payload_bytes_total", "UDP payload bytes translated.", "queue", "direction")
	descUDPDrops     = desc("udp_drops_total", "UDP datagrams dropped, by reason (also in vunet_queue_drops_total).", "queue", "direction", "reason")
	descEchoReq      = desc("icmp_echo_requests_total", "Guest ICMP/ICMPv6 echo requests sent out of a ping socket.", "queue")
	descEchoRep      = desc("icmp_echo_replies_total", "ICMP/ICMPv6 echo replies delivered to the guest.", "queue")
	descLeases       = desc("dhcp_leases_total", "Addresses handed to the guest (service dhcp: DHCPACK with an address; dhcpv6: REPLY with an IA address).", "queue", "service")
	descFragments    = desc("ip_fragments_total", "IP fragments from the guest, by outcome (received, reassembled datagrams, and the reasons fragments or partial datagrams were given up).", "queue", "outcome")
	descNDPSent      = desc("ndp_messages_sent_total", "NDP messages sent to the guest, by type (router_advert: solicited and periodic, neighbor_advert).", "queue", "type")

	descTCPConns     = desc("tcp_connections", "Live TCP connections, by state.", "queue", "state")
	descTCPConnects  = desc("tcp_connects_total", "Host connect() attempts for guest connections.", "queue")
	descTCPConnFail  = desc("tcp_connect_failures_total", "Host connect() attempts refused, unreachable or timed out.", "queue")
	descTCPTableFull = desc("tcp_table_full_total", "Guest SYNs refused because the connection table was full.", "queue")
	descTCPAccepted  = desc("tcp_accepted_total", "Connections accepted on forwarded host ports.", "queue")
	descTCPStalls    = desc("tcp_stalls_total", "Transitions into STALLED (guest window exhausted or all socket data in flight).", "queue")
	descTCPClamps    = desc("tcp_window_clamp_workarounds_total", "TCP_WINDOW_CLAMP applications that reopen a host socket's window after a stall.", "queue")
	descTCPRetrans   = desc("tcp_retransmissions_total", "Rewinds of the sequence sent to the guest, by cause.", "queue", "cause")
	descTCPRSTSent   = desc("tcp_resets_sent_total", "RSTs sent to the guest.", "queue")
	descTCPRSTRecv   = desc("tcp_resets_received_total", "RSTs received from the guest.", "queue")
	descTCPBytes     = desc("tcp_payload_bytes_total", "TCP payload bytes translated (to_guest: committed to guest frames, from_guest: written to host sockets).", "queue", "direction")

	descMessages  = desc("vhost_user_messages_total", "vhost-user requests received from the front-end, by request.", "request")
	descErrors    = desc("vhost_user_errors_total", "vhost-user protocol errors, by reason.", "reason")
	descConnected = desc("vhost_user_frontend_connected", "1 while a vhost-user front-end is connected.")
	descSessions  = desc("vhost_user_sessions_total", "vhost-user front-end sessions started.")
	descFeature   = desc("vhost_user_feature_negotiated", "Virtio feature bits acknowledged by the front-end in the current session (1 per set bit).", "bit")
	descProtoFeat = desc("vhost_user_protocol_feature_negotiated", "vhost-user protocol feature bits acknowledged in the current session (1 per set bit).", "bit")
)

// collector reads Sources at scrape time.
type collector struct{ src Sources }

// NewCollector returns a Prometheus collector over src.
func NewCollector(src Sources) prometheus.Collector { return &collector{src: src} }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	pairs := c.src.QueuePairs
	if pairs < 1 {
		pairs = 1
	}
	for p := 0; p < pairs && p < vhostuser.MaxQueuePairs; p++ {
		q := strconv.Itoa(p)
		if c.src.Control != nil {
			c.collectRing(ch, &c.src.Control.Rings[2*p], q, "rx")
			c.collectRing(ch, &c.src.Control.Rings[2*p+1], q, "tx")
		}
		if c.src.PairStats != nil {
			st := c.src.PairStats(p)
			if st == nil {
				st = &zeroPair
			}
			collectPair(ch, st, q)
		}
		if c.src.PairTCPStats != nil {
			st := c.src.PairTCPStats(p)
			if st == nil {
				st = &zeroTCP
			}
			collectTCP(ch, st, q)
		}
	}
	if s := c.src.Control; s != nil {
		for r := vhostuser.Request(0); r < vhostuser.NumRequests; r++ {
			if n := s.MessageCount(r); n > 0 {
				counter(ch, descMessages, n, r.String())
			}
		}
		for r := vhostuser.ErrorReason(0); r < vhostuser.NumErrorReasons; r++ {
			counter(ch, descErrors, s.ErrorCount(r), r.String())
		}
		gauge(ch, descConnected, float64(s.Connected.Load()))
		counter(ch, descSessions, s.Sessions.Load())
		eachBit(s.Features.Load(), func(b int) { gauge(ch, descFeature, 1, strconv.Itoa(b)) })
		eachBit(s.ProtocolFeatures.Load(), func(b int) { gauge(ch, descProtoFeat, 1, strconv.Itoa(b)) })
	}
}

func (c *collector) collectRing(ch chan<- prometheus.Metric, st *virtqueue.Stats, q, dir string) {
	counter(ch, descNotify, st.Notifies.Load(), q, dir)
	counter(ch, descSuppressed, st.NotifiesSuppressed.Load(), q, dir)
	counter(ch, descKicks, st.Kicks.Load(), q, dir)
	counter(ch, descBadChains, st.BadChains.Load(), q, dir)
}

func collectPair(ch chan<- prometheus.Metric, st *tcpstack.QueueStats, q string) {
	for _, d := range []struct {
		name string
		s    *tcpstack.DirStats
	}{{"tx", &st.TX}, {"rx", &st.RX}} {
		counter(ch, descFrames, d.s.Frames.Load(), q, d.name)
		counter(ch, descBytes, d.s.Bytes.Load(), q, d.name)
		counter(ch, descBatches, d.s.Batches.Load(), q, d.name)
		for r := tcpstack.DropReason(0); r < tcpstack.NumDropReasons; r++ {
			counter(ch, descDrops, d.s.Drops[r].Load(), q, d.name, r.String())
		}
	}
	counter(ch, descRXWaited, st.RXWaitedForDescriptors.Load(), q)
	counter(ch, descRXWasted, st.RXChainsWasted.Load(), q)
	counter(ch, descWakeups, st.Wakeups.Load(), q)
	counter(ch, descLoopStarts, st.LoopStarts.Load(), q)
	counter(ch, descMemFaults, st.MemoryFaults.Load(), q)
	counter(ch, descFlowsOpen, st.FlowsOpened.Load(), q)
	counter(ch, descFlowsClose, st.FlowsClosed.Load(), q)
	counter(ch, descFlowsEvict, st.FlowsEvicted.Load(), q)
	for e := tcpstack.EtherClass(0); e < tcpstack.NumEtherClasses; e++ {
		counter(ch, descTXEther, st.TXByEtherType[e].Load(), q, e.String())
	}
	for s := tcpstack.Service(0); s < tcpstack.NumServices; s++ {
		counter(ch, descService, st.ServiceReplies[s].Load(), q, s.String())
	}
	collectProto(ch, &st.Proto, q)
}

func collectProto(ch chan<- prometheus.Metric, p *tcpstack.ProtoStats, q string) {
	gauge(ch, descUDPFlows, float64(p.UDPFlows.Load()), q)
	gauge(ch, descICMPFlows, float64(p.ICMPFlows.Load()), q)
	for d := tcpstack.FlowDir(0); d < tcpstack.NumFlowDirs; d++ {
		counter(ch, descUDPDatagrams, p.UDPDatagrams[d].Load(), q, d.String())
		counter(ch, descUDPBytes, p.UDPBytes[d].Load(), q, d.String())
		for r := tcpstack.DropReason(0); r < tcpstack.NumDropReasons; r++ {
			counter(ch, descUDPDrops, p.UDPDrops[d][r].Load(), q, d.String(), r.String())
		}
	}
	counter(ch, descEchoReq, p.ICMPEchoRequests.Load(), q)
	counter(ch, descEchoRep, p.ICMPEchoReplies.Load(), q)
	counter(ch, descLeases, p.DHCPLeases.Load(), q, "dhcp")
	counter(ch, descLeases, p.DHCPv6Leases.Load(), q, "dhcpv6")
	counter(ch, descNDPSent, p.RouterAdverts.Load(), q, "router_advert")
	counter(ch, descNDPSent, p.NeighborAdverts.Load(), q, "neighbor_advert")
	for o := tcpstack.FragOutcome(0); o < tcpstack.NumFragOutcomes; o++ {
		counter(ch, descFragments, p.Fragments[o].Load(), q, o.String())
	}
}

func eachBit(v uint64, fn func(bit int)) {
	for v != 0 {
		b := bits.TrailingZeros64(v)
		fn(b)
		v &^= 1 << b
	}
}

func collectTCP(ch chan<- prometheus.Metric, st *tcpstack.TCPStats, q string) {
	// State 0 is a free slot, not a connection.
	for i := 1; i < len(st.ConnsByState); i++ {
		gauge(ch, descTCPConns, float64(st.ConnsByState[i].Load()), q, tcpstack.TCPStateName(i))
	}
	counter(ch, descTCPConnects, st.Connects.Load(), q)
	counter(ch, descTCPConnFail, st.ConnectFailures.Load(), q)
	counter(ch, descTCPTableFull, st.TableFull.Load(), q)
	counter(ch, descTCPAccepted, st.Accepted.Load(), q)
	counter(ch, descTCPStalls, st.Stalls.Load(), q)
	counter(ch, descTCPClamps, st.ClampApplications.Load(), q)
	for c := tcpstack.TCPRetransCause(0); c < tcpstack.NumTCPRetransCauses; c++ {
		counter(ch, descTCPRetrans, st.Retransmits[c].Load(), q, c.String())
	}
	counter(ch, descTCPRSTSent, st.RSTSent.Load(), q)
	counter(ch, descTCPRSTRecv, st.RSTReceived.Load(), q)
	counter(ch, descTCPBytes, st.BytesToGuest.Load(), q, "to_guest")
	counter(ch, descTCPBytes, st.BytesFromGuest.Load(), q, "from_guest")
}

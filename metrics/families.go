package metrics

import "github.com/prometheus/client_golang/prometheus"

// The label vocabulary. One word per idea across every family: a query
// that joins queue and TCP metrics on direction must not translate.
const (
	// The direction of traffic, said from the guest's side of the wire.
	// virtio's own "tx"/"rx" name the rings as the guest's driver sees them
	// (tx: the guest sends), which an operator on the host reads the other
	// way round (a host NIC's tx leaves the host); to_guest and from_guest
	// read the same from either side.
	dirToGuest   = "to_guest"
	dirFromGuest = "from_guest"
)

// family describes one exported metric family. Everything the exposition
// says about a family comes from here, and the README table is checked
// against the exposition (readme_test.go), so a new family is one line
// here, one line in Collect and one README row.
type family struct {
	name   string // without the vunet_ prefix
	kind   prometheus.ValueType
	help   string
	labels []string
	desc   *prometheus.Desc
}

const namespace = "vunet"

// families is every family fam made, in declaration order: Describe sends
// them all, so none can be left out by hand.
var families []*family

func fam(kind prometheus.ValueType, name, help string, labels ...string) *prometheus.Desc {
	f := &family{name: name, kind: kind, help: help, labels: labels,
		desc: prometheus.NewDesc(namespace+"_"+name, help, labels, nil)}
	families = append(families, f)
	return f.desc
}

func counterFam(name, help string, labels ...string) *prometheus.Desc {
	return fam(prometheus.CounterValue, name, help, labels...)
}

func gaugeFam(name, help string, labels ...string) *prometheus.Desc {
	return fam(prometheus.GaugeValue, name, help, labels...)
}

// Label sets used by several families.
var (
	queueDir       = []string{"queue", "direction"}
	queueDirReason = []string{"queue", "direction", "reason"}
)

// The families. Series of a queue appear once its pair has run (queue 0 from
// the start); families labelled by reason carry only the reasons that
// happened (see collector.go).
var (
	descBuildInfo = gaugeFam("build_info", "vunet's build: version (-ldflags main.version, else the module version), VCS revision (+dirty: uncommitted changes), Go version. Always 1.", "version", "revision", "goversion")

	// Rings: the virtqueues as the control plane set them up.
	descNotify     = counterFam("queue_notifications_total", "Interrupts sent to the guest (call eventfd writes).", queueDir...)
	descSuppressed = counterFam("queue_notifications_suppressed_total", "Used-ring publications that needed no interrupt (EVENT_IDX or NO_INTERRUPT).", queueDir...)
	descKicks      = counterFam("queue_kicks_total", "Guest kicks seen on the kick eventfd (coalesced: kicks that come before the back-end looks count once).", queueDir...)
	descBadChains  = counterFam("queue_bad_chains_total", "Malformed descriptor chains returned to the guest with length 0.", queueDir...)
	descDirtyLog   = counterFam("queue_dirty_log_writes_total", "Writes into guest memory marked in the front-end's dirty-page log while it migrates the guest (used-ring updates, RX buffers); the series appears at the first.", queueDir...)
	descDirtyMiss  = counterFam("queue_dirty_log_misses_total", "Writes the front-end's dirty-page log was too small to cover, wholly or partly: those pages may reach the migration's destination stale; the series appears at the first.", queueDir...)

	// The data path of a queue pair.
	descFrames     = counterFam("queue_frames_total", "Ethernet frames moved through a queue (from_guest: taken from the guest, to_guest: placed in used descriptors).", queueDir...)
	descBytes      = counterFam("queue_bytes_total", "Ethernet bytes moved through a queue, virtio-net header excluded.", queueDir...)
	descBatches    = counterFam("queue_batches_total", "Used-ring publications (one per batch of frames).", queueDir...)
	descDrops      = counterFam("queue_drops_total", "Frames dropped by the data path, by reason; a reason's series appears at its first drop.", queueDirReason...)
	descEther      = counterFam("queue_classified_frames_total", "Frames from the guest with a whole Ethernet header, by ethertype class.", "queue", "ethertype")
	descDescWaits  = counterFam("queue_descriptor_waits_total", "Waits for the guest to refill its RX ring: frames for the guest (link-service replies, TCP, datagrams) found no free descriptor; once per wait of each producer that ran the ring dry.", "queue")
	descWasted     = counterFam("queue_wasted_chains_total", "Guest buffers returned to the guest empty (could be neither used nor rewound).", "queue")
	descWakeups    = counterFam("queue_loop_wakeups_total", "Event-loop returns from epoll_wait.", "queue")
	descLoopPolls  = counterFam("queue_loop_polls_total", "Bounded busy-polls of the event loop before it sleeps, by result (hit: an event came within the poll; miss: the loop slept after it); each result's series appears at its first count.", "queue", "result")
	descLoopStarts = counterFam("queue_loop_starts_total", "Starts of the queue pair's event loop (ring rebuilds, reconnects).", "queue")
	descMemFaults  = counterFam("queue_memory_faults_total", "Event loops stopped by a fault on guest memory (front-end shrank its memory file).", "queue")
	descPolicy     = counterFam("policy_drops_total", "Guest packets refused by the address policy, by protocol and reason (also in vunet_queue_drops_total as reason policy); a series appears at its first drop.", "queue", "protocol", "reason")
	descFlows      = gaugeFam("flows", "Live flows, by protocol (tcp: connections in every state; udp; icmp: echo flows), one host socket each.", "queue", "protocol")
	descFlowCap    = gaugeFam("flow_table_capacity", "Flows the queue pair's tables hold, by protocol (udp and icmp share the datagram table, each may fill the guest's share of it; udp adds the share of forwarded UDP ports' peers where the pair has such ports).", "queue", "protocol")
	descFlowsOpen  = counterFam("flows_opened_total", "Flows opened for the guest or a forwarded port's peer, by protocol (flows handed over between queue pairs or vunets are in vunet_flow_moves_total).", "queue", "protocol")
	descFlowsClose = counterFam("flows_closed_total", "Flows closed, by protocol (evictions included; hand-overs are in vunet_flow_moves_total).", "queue", "protocol")
	descFlowsEvict = counterFam("flows_evicted_total", "Flows closed early to make room in a full flow table, by protocol (udp, icmp: TCP refuses instead).", "queue", "protocol")
	descFlowMoves  = counterFam("flow_moves_total", "Flows handed between queue pairs because the guest sent their frames on another TX queue (and, in a live migration, between vunets), by protocol and way (in: taken over, out: handed on); a series appears at its first move.", "queue", "protocol", "way")
	descFetches    = counterFam("flow_fetches_total", "Requests to another queue pair for the flow of a guest frame that pair held (the frame waited for it); the series appears at the first.", "queue")
	descFetchMiss  = counterFam("flow_fetch_misses_total", "Flow requests the asked queue pair could not serve (the flow had gone meanwhile); the series appears at the first.", "queue")
	descService    = counterFam("service_replies_total", "Frames produced by the link services (ARP, DHCP, DHCPv6, NDP) and ICMP echo replies, by service.", "queue", "service")

	// The stream transport (-netdev stream) in place of pair 0's rings.
	descStreamSessions = counterFam("stream_sessions_total", "Connections served on the stream transport (QEMU's -netdev stream); the series appears at the first.", "queue")
	descStreamCalls    = counterFam("stream_calls_total", "recv (from_guest) and sendmsg (to_guest) calls on the stream socket that moved bytes; a series appears at the first.", queueDir...)
	descStreamBytes    = counterFam("stream_bytes_total", "Bytes read from and written to the stream socket, length prefixes included; a series appears at the first.", queueDir...)
	descStreamWaits    = counterFam("stream_write_waits_total", "Writes to the stream socket that stopped short (its buffer full): the rest waited for the socket to drain; the series appears at the first.", "queue")
	descStreamCloses   = counterFam("stream_closes_total", "Stream connections dropped by vunet, by reason (bad_length: a frame length out of bounds, truncated: closed inside a frame, write_error); a series appears at the first.", "queue", "reason")

	// UDP, ICMP and the link services.
	descUDPDatagrams = counterFam("udp_datagrams_total", "UDP datagrams translated (to_guest: delivered to the guest, from_guest: sent from a host socket).", queueDir...)
	descUDPUSOFrames = counterFam("udp_uso_frames_total", "Frames that carried several UDP datagrams (USO: to_guest, runs the host socket's UDP_GRO coalesced, with VIRTIO_NET_F_GUEST_USO4/6; from_guest, the guest's own, with VIRTIO_NET_F_HOST_USO); a series appears at the first.", queueDir...)
	descUDPBytes     = counterFam("udp_payload_bytes_total", "UDP payload bytes translated.", queueDir...)
	descUDPDrops     = counterFam("udp_drops_total", "UDP datagrams dropped, by reason (also in vunet_queue_drops_total); a reason's series appears at its first drop.", queueDirReason...)
	descEchoReq      = counterFam("icmp_echo_requests_total", "Guest ICMP/ICMPv6 echo requests sent out of a ping socket.", "queue")
	descEchoRep      = counterFam("icmp_echo_replies_total", "ICMP/ICMPv6 echo replies delivered to the guest.", "queue")
	descLeases       = counterFam("dhcp_leases_total", "Addresses handed to the guest (service dhcp: DHCPACK with an address; dhcpv6: REPLY with an IA address).", "queue", "service")
	descFragments    = counterFam("ip_fragments_total", "IP fragments from the guest, by outcome (received, reassembled datagrams, and the reasons fragments or partial datagrams were given up).", "queue", "outcome")
	descNDPSent      = counterFam("ndp_messages_sent_total", "NDP messages sent to the guest, by type (router_advert: solicited and periodic, neighbor_advert).", "queue", "type")
	descDNSFwdUDP    = counterFam("dns_forward_datagrams_total", "Guest UDP datagrams sent to the DNS forward's resolver (--dns-forward), one per query; exported with a DNS forward configured.", "queue")
	descDNSFwdTCP    = counterFam("dns_forward_connections_total", "Guest TCP connections to the DNS forward's resolver (--dns-forward); exported with a DNS forward configured.", "queue")

	// TCP translation.
	descTCPConns     = gaugeFam("tcp_connections", "Live TCP connections, by state.", "queue", "state")
	descTCPConnects  = counterFam("tcp_connects_total", "Host connect() attempts for guest connections.", "queue")
	descTCPConnFail  = counterFam("tcp_connect_failures_total", "Guest connections not made, by reason: SYNs refused by the address policy (policy) or for want of a slot (table_full), host connect() attempts refused, unreachable, timed out or failed otherwise (error).", "queue", "reason")
	descTCPAccepted  = counterFam("tcp_accepted_total", "Connections accepted on forwarded host ports.", "queue")
	descTCPRefusals  = counterFam("tcp_accept_refusals_total", "Connections accepted on forwarded host ports and reset at once, by reason (table_full, guest_unknown: the guest's address is not known yet, duplicate: the same addresses and ports are still in the table).", "queue", "reason")
	descTCPBackoffs  = counterFam("tcp_accept_backoffs_total", "Accepts on forwarded host ports that failed for want of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) and paused the listener until a connection closed or a back-off timer fired.", "queue")
	descTCPStalls    = counterFam("tcp_stalls_total", "Transitions into STALLED (guest window exhausted or all socket data in flight).", "queue")
	descTCPStalled   = gaugeFam("tcp_stalled_connections", "Connections STALLED now: not reading their host socket until the guest acknowledges or opens its window.", "queue")
	descTCPClamps    = counterFam("tcp_window_clamp_attempts_total", "TCP_WINDOW_CLAMP window workarounds applied to a host socket after a guest ACK let bytes be consumed (only where the kernel was found to need it); the series appears at the first.", "queue")
	descTCPClampsEff = counterFam("tcp_window_clamp_effective_total", "Window workarounds after which the host socket's receive window state (rcv_ssthresh, advertised window) grew; the series appears at the first.", "queue")
	descTCPProbes    = counterFam("tcp_window_probes_total", "Zero-window probes sent to the guest (its window shut with nothing in flight and data waiting); the series appears at the first.", "queue")
	descTCPChallenge = counterFam("tcp_challenge_acks_limited_total", "Challenge ACKs (RFC 5961: the answer to a guest RST in the window but not at the next byte, a SYN on an established connection, an ACK of data never sent) not sent because the connection had sent one less than 500 ms before; the series appears at the first.", "queue")
	descTCPRetrans   = counterFam("tcp_retransmissions_total", "Data sent to the guest again, by cause: rewinds of the sequence (dup_ack: a guest without SACK asked again, once per loss; timeout: no ACK within the RTO, which follows the round trip the guest's ACKs show, 200 ms at least, 2 s before the first, and a SYN-ACK the guest did not acknowledge within 1 s, doubling; window_reopened: it reopened a window it had shut on data in flight, a series that appears at the first), and with a guest that negotiated SACK, only the holes its SACK blocks show (sack: a recovery, started on the third ACK that SACKs more, or at once when nothing more can be sent; tail_probe: the last segment again when data was in flight, nothing more could be sent and the guest said nothing for two round trips, plus 200 ms for its delayed ACK when one segment was in flight).", "queue", "cause")
	descTCPOOO       = counterFam("tcp_out_of_order_bytes_total", "Guest payload bytes that came past a hole (a frame lost on the way) and were kept and SACKed until it was filled; the series appears at the first.", "queue")
	descTCPOOOFull   = counterFam("tcp_out_of_order_no_buffer_total", "Guest segments past a hole that could not be kept because the queue's table held all its out-of-order buffers (dropped, sent again by the guest); the series appears at the first.", "queue")
	descTCPResets    = counterFam("tcp_connection_resets_total", "Connections ended by a reset (RST to the guest, the host peer or both), by reason: guest_rst, host_reset (the peer reset, or its socket failed), timeout (handshake, retransmission, idle), session_end (the front-end left or vunet stopped), error. Failed connects are in vunet_tcp_connect_failures_total.", "queue", "reason")
	descTCPRSTSent   = counterFam("tcp_resets_sent_total", "RSTs sent to the guest.", "queue")
	descTCPRSTRecv   = counterFam("tcp_resets_received_total", "RSTs received from the guest.", "queue")
	descTCPBytes     = counterFam("tcp_payload_bytes_total", "TCP payload bytes translated (to_guest: committed to guest frames, from_guest: written to host sockets).", queueDir...)

	// Forwarded host ports, the Stack's (not a queue's).
	descFwdPorts    = gaugeFam("forward_ports", "Forwarded host ports open (-t, -u, and those added at run time), by protocol; one per port and address family.", "protocol")
	descFwdBindFail = counterFam("forward_bind_failures_total", "Forwarded host ports that could not be opened (in use, not permitted, or skipped by the best-effort rule of all and exclusion-only specifications), by protocol.", "protocol")

	// The vhost-user control plane.
	descMessages  = counterFam("vhost_user_messages_total", "vhost-user requests received from the front-end, by request; a request's series appears when it is first seen.", "request")
	descErrors    = counterFam("vhost_user_errors_total", "vhost-user protocol errors, by reason.", "reason")
	descConnected = gaugeFam("vhost_user_frontend_connected", "1 while a vhost-user front-end is connected.")
	descSessions  = counterFam("vhost_user_sessions_total", "vhost-user front-end sessions started.")
	descGuestMem  = gaugeFam("vhost_user_guest_memory_bytes", "Guest memory mapped for the current front-end session (capped by --max-guest-memory).")
	descFeature   = gaugeFam("vhost_user_feature_negotiated", "Virtio feature bits acknowledged by the front-end in the current session (1 per set bit).", "bit")
	descProtoFeat = gaugeFam("vhost_user_protocol_feature_negotiated", "vhost-user protocol feature bits acknowledged in the current session (1 per set bit).", "bit")
)

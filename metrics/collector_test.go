package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/stats"
	"vunet/vhostuser"
)

var testBuild = BuildInfo{Version: "1.2.3", Revision: "0123456789abcdef0123456789abcdef01234567+dirty", GoVersion: "go1.26.0"}

// testSources offers pairs queue pairs of which those in ran have run
// (data-path counters exist).
func testSources(pairs int, ran ...int) (Sources, *vhostuser.Stats, map[int]*stats.Queue, map[int]*stats.TCP) {
	ctl := &vhostuser.Stats{}
	st := map[int]*stats.Queue{}
	tcp := map[int]*stats.TCP{}
	for _, p := range ran {
		st[p], tcp[p] = &stats.Queue{}, &stats.TCP{}
	}
	return Sources{
		QueuePairs:   pairs,
		Control:      ctl,
		PairStats:    func(i int) *stats.Queue { return st[i] },
		PairTCPStats: func(i int) *stats.TCP { return tcp[i] },
		Build:        testBuild,
	}, ctl, st, tcp
}

// scrape serves reg over HTTP as vunet does and returns the exposition.
func scrape(t *testing.T, src Sources) string {
	t.Helper()
	srv := httptest.NewServer(Handler(NewRegistry(src)))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// samples maps each series of an exposition to its value.
func samples(text string) map[string]string {
	lines := map[string]string{}
	for _, l := range strings.Split(text, "\n") {
		if l == "" || l[0] == '#' {
			continue
		}
		if i := strings.LastIndexByte(l, ' '); i > 0 {
			lines[l[:i]] = l[i+1:]
		}
	}
	return lines
}

func TestCollectorReadsCounters(t *testing.T) {
	// Pair 1 ran, pair 0 did not (yet).
	src, ctl, pairs, tcps := testSources(2, 1)
	st, tcp1 := pairs[1], tcps[1]
	tcp1.ClampAttempts.Add(4)
	tcp1.ClampEffective.Add(1)
	tcp1.Retransmits[stats.TCPRetransTimeout].Add(1)
	tcp1.ConnsByState[4].Add(9) // established
	ctl.Messages[vhostuser.ReqGetFeatures].Add(3)
	ctl.Connected.Store(1)
	ctl.GuestMemory.Store(512 << 20)
	ctl.Errors[vhostuser.ErrReasonMemoryLimit].Add(2)
	ctl.Features.Store(1<<32 | 1<<15)
	ctl.Rings[3].BadChains.Add(7) // pair 1, TX: from the guest
	ctl.Rings[0].Notifies.Add(5)  // pair 0, RX: to the guest
	st.TX.Frames.Add(11)
	st.RX.Bytes.Add(1500)
	st.TX.Drops[stats.DropUnknownEtherType].Add(2)
	st.TXByEtherType[stats.EtherOther].Add(2)
	st.RXWaitedForDescriptors.Add(2)
	st.RXChainsWasted.Add(6)
	st.MemoryFaults.Add(1)
	st.Flows.Live[stats.FlowUDP].Add(3)
	st.Flows.Capacity[stats.FlowTCP].Store(1024)
	st.Flows.Evicted[stats.FlowICMP].Add(2)
	tcp1.ConnectFailures[stats.TCPRefused].Add(5)
	tcp1.Resets[stats.TCPHostReset].Add(6)
	tcp1.AcceptRefusals[stats.TCPGuestUnknown].Add(1)
	tcp1.Stalled.Store(2)
	st.Proto.UDPDatagrams[stats.FromGuest].Add(6)
	st.Proto.UDPBytes[stats.ToGuest].Add(600)
	st.Proto.UDPUSOFrames[stats.ToGuest].Add(4)
	st.Proto.UDPDrops[stats.ToGuest][stats.DropNoFit].Add(2)
	st.Proto.ICMPEchoRequests.Add(4)
	st.Proto.ICMPEchoReplies.Add(3)
	st.Proto.DHCPLeases.Add(1)
	st.Proto.DHCPv6Leases.Add(2)
	st.Proto.RouterAdverts.Add(5)
	st.Proto.NeighborAdverts.Add(7)
	st.Proto.Fragments[stats.FragReassembled].Add(8)
	st.PolicyDrops[addrpolicy.UDP][addrpolicy.DstLoopback].Add(9)
	st.TX.Drops[stats.DropPolicy].Add(9)

	want := map[string]string{
		`vunet_build_info{goversion="go1.26.0",revision="0123456789abcdef0123456789abcdef01234567+dirty",version="1.2.3"}`: "1",
		`vunet_vhost_user_messages_total{request="` + vhostuser.ReqGetFeatures.String() + `"}`:                             "3",
		`vunet_vhost_user_frontend_connected`:                                                  "1",
		`vunet_vhost_user_errors_total{reason="malformed"}`:                                    "0",
		`vunet_vhost_user_guest_memory_bytes`:                                                  "5.36870912e+08",
		`vunet_vhost_user_errors_total{reason="memory_limit"}`:                                 "2",
		`vunet_vhost_user_feature_negotiated{bit="32"}`:                                        "1",
		`vunet_vhost_user_feature_negotiated{bit="15"}`:                                        "1",
		`vunet_queue_bad_chains_total{direction="from_guest",queue="1"}`:                       "7",
		`vunet_queue_notifications_total{direction="to_guest",queue="0"}`:                      "5",
		`vunet_queue_frames_total{direction="from_guest",queue="1"}`:                           "11",
		`vunet_queue_bytes_total{direction="to_guest",queue="1"}`:                              "1500",
		`vunet_queue_drops_total{direction="from_guest",queue="1",reason="unknown_ethertype"}`: "2",
		`vunet_queue_classified_frames_total{ethertype="other",queue="1"}`:                     "2",
		`vunet_queue_classified_frames_total{ethertype="ipv4",queue="1"}`:                      "0",
		`vunet_queue_descriptor_waits_total{queue="1"}`:                                        "2",
		`vunet_queue_wasted_chains_total{queue="1"}`:                                           "6",
		`vunet_queue_memory_faults_total{queue="1"}`:                                           "1",
		// Queue 0 is there before it first runs, as zeros.
		`vunet_queue_memory_faults_total{queue="0"}`:                                "0",
		`vunet_queue_frames_total{direction="from_guest",queue="0"}`:                "0",
		`vunet_tcp_window_clamp_attempts_total{queue="1"}`:                          "4",
		`vunet_tcp_window_clamp_effective_total{queue="1"}`:                         "1",
		`vunet_tcp_retransmissions_total{cause="timeout",queue="1"}`:                "1",
		`vunet_tcp_retransmissions_total{cause="dup_ack",queue="0"}`:                "0",
		`vunet_tcp_connections{queue="1",state="` + stats.TCPStateName(4) + `"}`:    "9",
		`vunet_flows{protocol="udp",queue="1"}`:                                     "3",
		`vunet_flows{protocol="udp",queue="0"}`:                                     "0",
		`vunet_flows{protocol="icmp",queue="1"}`:                                    "0",
		`vunet_flow_table_capacity{protocol="tcp",queue="1"}`:                       "1024",
		`vunet_flows_evicted_total{protocol="icmp",queue="1"}`:                      "2",
		`vunet_flows_evicted_total{protocol="udp",queue="1"}`:                       "0",
		`vunet_tcp_connect_failures_total{queue="1",reason="refused"}`:              "5",
		`vunet_tcp_connect_failures_total{queue="1",reason="policy"}`:               "0",
		`vunet_tcp_connection_resets_total{queue="1",reason="host_reset"}`:          "6",
		`vunet_tcp_accept_refusals_total{queue="1",reason="guest_unknown"}`:         "1",
		`vunet_tcp_stalled_connections{queue="1"}`:                                  "2",
		`vunet_udp_datagrams_total{direction="from_guest",queue="1"}`:               "6",
		`vunet_udp_uso_frames_total{direction="to_guest",queue="1"}`:                "4",
		`vunet_udp_payload_bytes_total{direction="to_guest",queue="1"}`:             "600",
		`vunet_udp_drops_total{direction="to_guest",queue="1",reason="no_fit"}`:     "2",
		`vunet_icmp_echo_requests_total{queue="1"}`:                                 "4",
		`vunet_icmp_echo_replies_total{queue="1"}`:                                  "3",
		`vunet_dhcp_leases_total{queue="1",service="dhcp"}`:                         "1",
		`vunet_dhcp_leases_total{queue="1",service="dhcpv6"}`:                       "2",
		`vunet_ndp_messages_sent_total{queue="1",type="router_advert"}`:             "5",
		`vunet_ndp_messages_sent_total{queue="1",type="neighbor_advert"}`:           "7",
		`vunet_ip_fragments_total{outcome="reassembled",queue="1"}`:                 "8",
		`vunet_ip_fragments_total{outcome="overlap",queue="0"}`:                     "0",
		`vunet_policy_drops_total{protocol="udp",queue="1",reason="dst_loopback"}`:  "9",
		`vunet_queue_drops_total{direction="from_guest",queue="1",reason="policy"}`: "9",
	}
	lines := samples(scrape(t, src))
	for k, v := range want {
		if got, ok := lines[k]; !ok || got != v {
			t.Errorf("%s = %q (present %v), want %s", k, got, ok, v)
		}
	}
	// Drop reasons that never happened have no series.
	for _, k := range []string{
		`vunet_queue_drops_total{direction="from_guest",queue="1",reason="runt"}`,
		`vunet_queue_drops_total{direction="to_guest",queue="1",reason="unknown_ethertype"}`,
		`vunet_udp_drops_total{direction="from_guest",queue="1",reason="no_fit"}`,
		`vunet_policy_drops_total{protocol="tcp",queue="1",reason="dst_loopback"}`,
		`vunet_vhost_user_messages_total{request="` + vhostuser.ReqSetOwner.String() + `"}`,
		// TCP never evicts; a reason outside a counter's set cannot happen.
		`vunet_flows_evicted_total{protocol="tcp",queue="1"}`,
		`vunet_tcp_connect_failures_total{queue="1",reason="guest_rst"}`,
		`vunet_tcp_connection_resets_total{queue="1",reason="refused"}`,
		`vunet_tcp_accept_refusals_total{queue="1",reason="timeout"}`,
		// No DNS forward configured, no forward counters given.
		`vunet_dns_forward_datagrams_total{queue="1"}`,
		`vunet_dns_forward_connections_total{queue="1"}`,
		`vunet_forward_ports{protocol="tcp"}`,
	} {
		if v, ok := lines[k]; ok {
			t.Errorf("%s = %s: a combination that never happened is exported", k, v)
		}
	}
	for _, k := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if !hasFamily(lines, k) {
			t.Errorf("missing %s", k)
		}
	}
	// go_build_info repeated vunet_build_info less well; process_network_*
	// counts the whole network namespace, not this process.
	for _, k := range []string{"go_build_info", "process_network_receive_bytes_total", "process_network_transmit_bytes_total"} {
		if hasFamily(lines, k) {
			t.Errorf("%s is exported", k)
		}
	}
}

func hasFamily(lines map[string]string, name string) bool {
	for l := range lines {
		if l == name || strings.HasPrefix(l, name+"{") {
			return true
		}
	}
	return false
}

// TestOnlyQueuesThatRanAreExported: 128 pairs offered, a guest that
// enabled 4. Before this rule an idle daemon exported ~125 series per
// offered queue (505 for 4 queues, ~16k for 128), most of them drop reasons
// that cannot happen in that direction.
func TestOnlyQueuesThatRanAreExported(t *testing.T) {
	count := func(src Sources) (perQueue map[string]int, global int) {
		perQueue = map[string]int{}
		for k := range samples(scrape(t, src)) {
			if !strings.HasPrefix(k, "vunet_") {
				continue
			}
			_, labels, _ := strings.Cut(k, "{")
			q := ""
			for _, l := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
				if v, ok := strings.CutPrefix(l, "queue="); ok {
					q = v
				}
			}
			if q == "" {
				global++
			} else {
				perQueue[q]++
			}
		}
		return perQueue, global
	}

	idle, _, _, _ := testSources(128)
	perQueue, global := count(idle)
	if len(perQueue) != 1 || perQueue[`"0"`] == 0 {
		t.Errorf("idle daemon with 128 pairs exports queues %v, want queue 0 only", perQueue)
	}
	const maxPerQueue = 92 // 89 today: see families.go
	if n := perQueue[`"0"`]; n > maxPerQueue {
		t.Errorf("%d series for one idle queue, want <= %d", n, maxPerQueue)
	}
	if global > 20 {
		t.Errorf("%d series without a queue label for an idle daemon", global)
	}

	// Pairs 0-3 ran; pair 77 never started but its TX ring saw a bad
	// chain: counted, so exported.
	busy, ctl, _, _ := testSources(128, 0, 1, 2, 3)
	ctl.Rings[2*77+1].BadChains.Add(1)
	perQueue, _ = count(busy)
	if len(perQueue) != 5 || perQueue[`"77"`] == 0 || perQueue[`"3"`] != perQueue[`"0"`] {
		t.Errorf("queues exported: %v, want 0-3 alike and 77", perQueue)
	}
	total := 0
	for _, n := range perQueue {
		total += n
	}
	t.Logf("idle queue: %d series; 128 pairs offered, 4 ran: %d per-queue series", perQueue[`"0"`], total)
}

// TestOneDirectionVocabulary: queue, UDP and TCP families say direction the
// same way, and tcpstack's own names for its directions agree with it.
func TestOneDirectionVocabulary(t *testing.T) {
	if stats.ToGuest.String() != dirToGuest || stats.FromGuest.String() != dirFromGuest {
		t.Fatalf("tcpstack directions %q/%q, metrics say %q/%q",
			stats.ToGuest, stats.FromGuest, dirToGuest, dirFromGuest)
	}
	src, _, _, _ := testSources(1, 0)
	for k := range samples(scrape(t, src)) {
		if _, rest, ok := strings.Cut(k, `direction="`); ok {
			if v, _, _ := strings.Cut(rest, `"`); v != dirToGuest && v != dirFromGuest {
				t.Errorf("%s: direction %q", k, v)
			}
		}
	}
}

func TestMetricNamesFollowConventions(t *testing.T) {
	src, _, _, _ := testSources(2, 1)
	problems, err := testutil.CollectAndLint(NewCollector(src))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	// No label name inside a metric name ("..._by_ethertype_total"), no
	// direction spelled into a name: aggregating the label away must
	// leave a name that still says what was counted.
	for _, f := range families {
		for _, bad := range []string{"_by_", "_tx_", "_rx_", "to_guest", "from_guest"} {
			if strings.Contains("_"+f.name+"_", bad) {
				t.Errorf("vunet_%s: name contains %q", f.name, bad)
			}
		}
	}
}

// TestForwardAndDNSFamilies: the forwarded ports' families appear with a
// Forwards source, per protocol that can be forwarded (not icmp), and the
// DNS forward's only where one is configured.
func TestForwardAndDNSFamilies(t *testing.T) {
	src, _, pairs, tcps := testSources(1, 0)
	fw := &stats.Forwards{}
	fw.Ports[stats.FlowTCP].Store(2)
	fw.BindFailures[stats.FlowUDP].Add(3)
	src.Forwards = fw
	src.DNSForward = true
	pairs[0].Proto.DNSForwardDatagrams.Add(4)
	tcps[0].DNSForwardConnects.Add(1)
	lines := samples(scrape(t, src))
	for k, v := range map[string]string{
		`vunet_forward_ports{protocol="tcp"}`:               "2",
		`vunet_forward_ports{protocol="udp"}`:               "0",
		`vunet_forward_bind_failures_total{protocol="udp"}`: "3",
		`vunet_dns_forward_datagrams_total{queue="0"}`:      "4",
		`vunet_dns_forward_connections_total{queue="0"}`:    "1",
		`vunet_forward_bind_failures_total{protocol="tcp"}`: "0",
	} {
		if got, ok := lines[k]; !ok || got != v {
			t.Errorf("%s = %q (present %v), want %s", k, got, ok, v)
		}
	}
	if v, ok := lines[`vunet_forward_ports{protocol="icmp"}`]; ok {
		t.Errorf("icmp forward ports exported (%s): ICMP is not forwarded", v)
	}
}

// TestOneProtocolVocabulary: the policy's protocols and the flows' say
// tcp, udp and icmp alike, so protocol joins across families.
func TestOneProtocolVocabulary(t *testing.T) {
	if int(addrpolicy.NumProtos) != int(stats.NumFlowProtos) {
		t.Fatalf("%d policy protocols, %d flow protocols", addrpolicy.NumProtos, stats.NumFlowProtos)
	}
	for p := addrpolicy.Proto(0); p < addrpolicy.NumProtos; p++ {
		if a, b := p.String(), stats.FlowProto(p).String(); a != b {
			t.Errorf("protocol %d: policy says %q, flows say %q", p, a, b)
		}
	}
}

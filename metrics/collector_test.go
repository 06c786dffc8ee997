package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"vunet/tcpstack"
	"vunet/vhostuser"
)

// testSources has two pairs; only pair 1 has data-path counters, as if
// pair 0 never ran.
func testSources(t *testing.T) (Sources, *vhostuser.Stats, *tcpstack.QueueStats) {
	t.Helper()
	ctl := &vhostuser.Stats{}
	pair1 := &tcpstack.QueueStats{}
	pairStats := func(i int) *tcpstack.QueueStats {
		if i == 1 {
			return pair1
		}
		return nil
	}
	tcp1 := &tcpstack.TCPStats{}
	tcp1.ClampApplications.Add(4)
	tcp1.Retransmits[tcpstack.TCPRetransTimeout].Add(1)
	tcp1.ConnsByState[4].Add(9) // established
	pairTCP := func(i int) *tcpstack.TCPStats {
		if i == 1 {
			return tcp1
		}
		return nil
	}
	return Sources{QueuePairs: 2, Control: ctl, PairStats: pairStats, PairTCPStats: pairTCP}, ctl, pair1
}

func TestCollectorReadsCounters(t *testing.T) {
	src, ctl, st := testSources(t)
	ctl.Messages[vhostuser.ReqGetFeatures].Add(3)
	ctl.Connected.Store(1)
	ctl.Features.Store(1<<32 | 1<<15)
	ctl.Rings[3].BadChains.Add(7) // pair 1, TX
	ctl.Rings[0].Notifies.Add(5)  // pair 0, RX
	st.TX.Frames.Add(11)
	st.RX.Bytes.Add(1500)
	st.RXWaitedForDescriptors.Add(2)
	st.MemoryFaults.Add(1)
	st.Proto.UDPFlows.Add(3)
	st.Proto.UDPDatagrams[tcpstack.FromGuest].Add(6)
	st.Proto.UDPBytes[tcpstack.ToGuest].Add(600)
	st.Proto.UDPDrops[tcpstack.ToGuest][tcpstack.DropNoFit].Add(2)
	st.Proto.ICMPEchoRequests.Add(4)
	st.Proto.ICMPEchoReplies.Add(3)
	st.Proto.DHCPLeases.Add(1)
	st.Proto.DHCPv6Leases.Add(2)
	st.Proto.RouterAdverts.Add(5)
	st.Proto.NeighborAdverts.Add(7)
	st.Proto.Fragments[tcpstack.FragReassembled].Add(8)

	reg := NewRegistry(src)
	want := map[string]string{
		`vunet_vhost_user_messages_total{request="` + vhostuser.ReqGetFeatures.String() + `"}`: "3",
		`vunet_vhost_user_frontend_connected`:                                                  "1",
		`vunet_vhost_user_feature_negotiated{bit="32"}`:                                        "1",
		`vunet_vhost_user_feature_negotiated{bit="15"}`:                                        "1",
		`vunet_queue_bad_chains_total{direction="tx",queue="1"}`:                               "7",
		`vunet_queue_notifications_total{direction="rx",queue="0"}`:                            "5",
		`vunet_queue_frames_total{direction="tx",queue="1"}`:                                   "11",
		`vunet_queue_bytes_total{direction="rx",queue="1"}`:                                    "1500",
		`vunet_queue_rx_waited_for_descriptors_total{queue="1"}`:                               "2",
		`vunet_queue_memory_faults_total{queue="1"}`:                                           "1",
		`vunet_queue_memory_faults_total{queue="0"}`:                                           "0",
		`vunet_queue_frames_total{direction="tx",queue="0"}`:                                   "0",
		`vunet_tcp_window_clamp_workarounds_total{queue="1"}`:                                  "4",
		`vunet_tcp_retransmissions_total{cause="timeout",queue="1"}`:                           "1",
		`vunet_tcp_retransmissions_total{cause="dup_ack",queue="0"}`:                           "0",
		`vunet_tcp_connections{queue="1",state="` + tcpstack.TCPStateName(4) + `"}`:            "9",
		`vunet_udp_flows{queue="1"}`:                                                           "3",
		`vunet_udp_flows{queue="0"}`:                                                           "0",
		`vunet_icmp_flows{queue="1"}`:                                                          "0",
		`vunet_udp_datagrams_total{direction="from_guest",queue="1"}`:                          "6",
		`vunet_udp_payload_bytes_total{direction="to_guest",queue="1"}`:                        "600",
		`vunet_udp_drops_total{direction="to_guest",queue="1",reason="no_fit"}`:                "2",
		`vunet_icmp_echo_requests_total{queue="1"}`:                                            "4",
		`vunet_icmp_echo_replies_total{queue="1"}`:                                             "3",
		`vunet_dhcp_leases_total{queue="1",service="dhcp"}`:                                    "1",
		`vunet_dhcp_leases_total{queue="1",service="dhcpv6"}`:                                  "2",
		`vunet_ndp_messages_sent_total{queue="1",type="router_advert"}`:                        "5",
		`vunet_ndp_messages_sent_total{queue="1",type="neighbor_advert"}`:                      "7",
		`vunet_queue_drops_total{direction="tx",queue="1",reason="protocol_disabled"}`:         "0",
		`vunet_queue_drops_total{direction="tx",queue="1",reason="fragment"}`:                  "0",
		`vunet_ip_fragments_total{outcome="reassembled",queue="1"}`:                            "8",
		`vunet_ip_fragments_total{outcome="overlap",queue="0"}`:                                "0",
	}
	srv := httptest.NewServer(Handler(reg))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	lines := map[string]string{}
	for _, l := range strings.Split(string(body), "\n") {
		if l == "" || l[0] == '#' {
			continue
		}
		if i := strings.LastIndexByte(l, ' '); i > 0 {
			lines[l[:i]] = l[i+1:]
		}
	}
	for k, v := range want {
		if got, ok := lines[k]; !ok || got != v {
			t.Errorf("%s = %q (present %v), want %s", k, got, ok, v)
		}
	}
	for _, k := range []string{"go_goroutines", "process_resident_memory_bytes", "go_build_info"} {
		found := false
		for l := range lines {
			if strings.HasPrefix(l, k) {
				found = true
			}
		}
		if !found {
			t.Errorf("missing %s", k)
		}
	}
}

func TestMetricNamesFollowConventions(t *testing.T) {
	src, _, _ := testSources(t)
	problems, err := testutil.CollectAndLint(NewCollector(src))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

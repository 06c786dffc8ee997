package e2e

import (
	"strconv"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// virtioNetFMQ is VIRTIO_NET_F_MQ, which a back-end offering several queue
// pairs must offer for the guest to use more than one.
const virtioNetFMQ = 22

// TestQEMUGuestMultiQueue offers two queue pairs to a two-vCPU guest, which
// enables both: QEMU then repeats features, protocol features and every
// memory region per pair (FIELD-NOTES.md), and vunet must run both pairs
// and still carry the guest's traffic.
func TestQEMUGuestMultiQueue(t *testing.T) {
	qemu.NeedQEMU(t)
	const pairs = 2
	d := qemu.StartDaemon(t, qemu.DaemonConfig{Args: []string{"--queues", strconv.Itoa(pairs)}, Metrics: true})
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Queues: pairs,
		CPUs:   pairs,
		Checks: []string{guest.CheckLink, guest.CheckARP},
		Params: map[string]string{
			guest.ParamAddr:    "10.0.2.15/24",
			guest.ParamARP:     "10.0.2.2",
			guest.ParamTimeout: "30s",
			guest.ParamHold:    "3s",
		},
		Timeout: 3 * time.Minute,
	})
	link := vm.RequireResult(t, guest.CheckLink, 90*time.Second)
	if f := link.Fields["features"]; len(f) <= virtioNetFMQ || f[virtioNetFMQ] != '1' {
		t.Errorf("guest features %q: VIRTIO_NET_F_MQ (bit %d) not negotiated with --queues %d; the guest uses one pair", f, virtioNetFMQ, pairs)
	}
	vm.RequireResult(t, guest.CheckARP, 30*time.Second)
	vm.RequireResult(t, guest.ResultDone, 30*time.Second)
	if d.Passt {
		return
	}
	started := map[string]bool{}
	for _, l := range d.Log.Match(func(l qemu.LogLine) bool { return l.Msg == "queue pair started" }) {
		started[l.Attr("pair")] = true
	}
	for p := 0; p < pairs; p++ {
		if !started[strconv.Itoa(p)] {
			t.Errorf("queue pair %d never started (started: %v)", p, started)
		}
	}
	m, err := d.WaitMetric(5*time.Second, "ARP reply counted", func(m qemu.Metrics) bool {
		return m.Sum("vunet_service_replies_total", "service", "arp") >= 1
	})
	if err != nil {
		t.Error(err)
	}
	if m != nil {
		if bad := m.Sum("vunet_vhost_user_errors_total"); bad != 0 {
			t.Errorf("vhost-user errors with %d queue pairs: %v", pairs, bad)
		}
		for p := 0; p < pairs; p++ {
			t.Logf("pair %d: tx %v rx %v frames", p,
				m.Sum("vunet_queue_frames_total", "queue", strconv.Itoa(p), "direction", "from_guest"),
				m.Sum("vunet_queue_frames_total", "queue", strconv.Itoa(p), "direction", "to_guest"))
		}
	}
	if err := vm.WaitExit(20 * time.Second); err != nil {
		t.Errorf("QEMU after power-off: %v", err)
	}
}

// mqHopXfer is each transfer's size in the queue-hop test: long enough
// under TCG with four vCPUs on a small host to span a dozen hops.
const mqHopXfer = 60 << 20

// TestQEMUGuestMultiQueueMovesFlows: a four-vCPU guest with four queue
// pairs (mq=on) moves its traffic to the next TX queue every 400 ms while
// it downloads and uploads 60 MB, echoes 2000 UDP datagrams and pings:
// the agent points every vCPU's XPS map at the next TX queue
// (vunet.qhop=xps), and the guest kernel moves each socket there once
// nothing of it is in flight, as it does for a thread the scheduler moved
// to another vCPU. (vunet.qhop=cpu, pinning the agent's threads to the next
// vCPU instead, moves the TCP and UDP flows as well under TCG, but not the
// ping, whose process is busybox's.) Both transfers are byte-exact, all
// echoes come back, vunet resets nothing, and it moves the connections and
// flows from pair to pair (vunet_flow_moves_total) instead.
func TestQEMUGuestMultiQueueMovesFlows(t *testing.T) {
	qemu.NeedQEMU(t)
	const pairs = 4
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	d := netDaemon(t, ns, "--queues", strconv.Itoa(pairs))
	if d.Passt {
		t.Skip("vunet's own flow moves")
	}
	params := map[string]string{
		guest.ParamTimeout:       "240s",
		guest.ParamQueueHop:      guest.QueueHopXPS + ",400ms",
		guest.ParamUDPEcho:       srv.Target(guest.TargetGW4),
		guest.ParamUDPEchoRounds: "100",
		guest.ParamPingCount:     "60",
	}
	checks := []string{guest.CheckLink, guest.CheckDHCP}
	for _, x := range [][2]string{{"mqdown", guest.XferDown}, {"mqup", guest.XferUp}} {
		params[guest.XferParam(x[0])] = guest.XferSpec(x[1], srv.Target(guest.TargetGW4), mqHopXfer)
		checks = append(checks, guest.XferCheck(x[0]))
	}
	checks = append(checks, guest.CheckUDPEcho, guest.CheckPing)
	vm := qemu.StartVM(t, qemu.VMConfig{Socket: d.Socket, Queues: pairs, CPUs: pairs, MemoryMiB: 512,
		Checks: checks, Params: params, Timeout: 12 * time.Minute})
	vm.RequireResult(t, guest.CheckDHCP, 120*time.Second)
	hops := func(r guest.Result) {
		t.Helper()
		if n, _ := strconv.Atoi(r.Fields["hops"]); n < 3 || r.Fields["hop_error"] != "" {
			t.Errorf("%s: %s hops (%s), want ≥ 3", r.Name, r.Fields["hops"], r.Fields["hop_error"])
		}
	}
	moves := func(proto string) float64 {
		m, err := d.WaitMetric(5*time.Second, "scrape", func(qemu.Metrics) bool { return true })
		if err != nil {
			t.Fatal(err)
		}
		return m.Sum("vunet_flow_moves_total", "protocol", proto, "way", "in")
	}
	for _, x := range []struct{ check, dir string }{{"mqdown", guest.XferDown}, {"mqup", guest.XferUp}} {
		before := moves("tcp")
		r := vm.RequireResult(t, guest.XferCheck(x.check), 300*time.Second)
		srv.CheckXfer(t, r, x.dir, mqHopXfer)
		hops(r)
		m := moves("tcp") - before
		t.Logf("%s: %s hops across %s vCPUs, vunet moved the connection %v times, %s Mbit/s", x.check,
			r.Fields["hops"], r.Fields["hop_queues"], m, r.Fields["mbps"])
		if m < 2 {
			t.Errorf("%s: vunet moved TCP connections %v times while the guest hopped %s times", x.check, m, r.Fields["hops"])
		}
	}
	before := moves("udp")
	u := vm.RequireResult(t, guest.CheckUDPEcho, 120*time.Second)
	if u.Fields["echoed"] != strconv.Itoa(100*len(guest.UDPEchoSizes)) || u.Fields["mismatched"] != "0" {
		t.Errorf("udp echo across hops: %s", u.Format())
	}
	hops(u)
	mu := moves("udp") - before
	if mu < 2 {
		t.Errorf("udp echo: vunet moved the flow %v times while the guest hopped %s times", mu, u.Fields["hops"])
	}
	before = moves("icmp")
	p := vm.RequireResult(t, guest.CheckPing, 120*time.Second)
	if p.Fields["sent"] != "60" || p.Fields["received"] != "60" {
		t.Errorf("ping across hops: %s", p.Format())
	}
	hops(p)
	m := moves("icmp") - before
	t.Logf("udp echo: %s hops, vunet moved the flow %v times; ping: %s hops, vunet moved the flow %v times",
		u.Fields["hops"], mu, p.Fields["hops"], m)
	if m < 1 {
		t.Errorf("ping: vunet never moved the echo flow while the guest hopped %s times", p.Fields["hops"])
	}
	vm.Finish(t)
	mt, err := d.WaitMetric(5*time.Second, "scrape", func(qemu.Metrics) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	if v := mt.Sum("vunet_tcp_resets_sent_total"); v != 0 {
		t.Errorf("vunet sent the guest %v RSTs", v)
	}
	for q := 0; q < pairs; q++ {
		t.Logf("pair %d: from guest %v frames, to guest %v, flows taken over %v", q,
			mt.Sum("vunet_queue_frames_total", "queue", strconv.Itoa(q), "direction", "from_guest"),
			mt.Sum("vunet_queue_frames_total", "queue", strconv.Itoa(q), "direction", "to_guest"),
			mt.Sum("vunet_flow_moves_total", "queue", strconv.Itoa(q), "way", "in"))
	}
	checkNoRingErrors(t, d)
}

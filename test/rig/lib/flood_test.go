package rig

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/tcpstack/linksvc"
	"vunet/test/load"
)

// guestTxDropped is what the guest's TAP dropped of its transmissions
// (its queue was full): frames the back-end never saw.
func guestTxDropped(t testing.TB, r *Rig) float64 {
	t.Helper()
	out, err := r.GuestExec(context.Background(), "cat", "/sys/class/net/"+tapName+"/statistics/tx_dropped")
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// rigStreamEnds: a host peer on the back-end namespace's loopback, reached
// by the guest through the gateway (vunet maps it to the loopback).
func rigStreamEnds(r *Rig) load.Ends {
	return load.Ends{
		Listen: func() (net.Listener, error) { return r.HostListen("tcp4", "127.0.0.1:0") },
		Dial: func(ctx context.Context, port int) (net.Conn, error) {
			return r.GuestDial(ctx, "tcp4", net.JoinHostPort(r.Gateway().String(), strconv.Itoa(port)))
		},
	}
}

// floodRound is one of each flood, with its counters checked.
type floodRound struct {
	t      *testing.T
	r      *Rig
	fl     *load.Flooder
	stream *load.Stream
	round  int
}

// settle scrapes until pred holds for the counters' change since before
// (or 20 s pass) and returns the change.
func (f *floodRound) settle(what string, before Metrics, pred func(d func(name string, labels ...string) float64) bool) func(string, ...string) float64 {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := metrics(f.t, f.r)
		d := func(name string, labels ...string) float64 {
			return m.Sum(name, labels...) - before.Sum(name, labels...)
		}
		if pred(d) || time.Now().After(deadline) {
			return d
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// progressed fails the test unless the concurrent stream moved on during
// a flood.
func (f *floodRound) progressed(what string, since int64) {
	f.t.Helper()
	if err := f.stream.Err(); err != nil {
		f.t.Fatalf("round %d, %s: the concurrent stream failed: %v", f.round, what, err)
	}
	if v := f.stream.Verified(); v <= since {
		f.t.Errorf("round %d, %s: the concurrent stream made no progress (%d bytes verified before and after)", f.round, what, v)
	}
}

const (
	floodTCPPorts   = 10000 // distinct destinations of the SYN flood
	floodUDPPorts   = 10000 // distinct destination ports of the UDP flood
	floodRate       = 5000  // frames a second
	floodLinkRate   = 5000  // ARP, NDP and DHCP requests a second, each
	floodLinkSecs   = 2
	fragOverlapping = 1000 // datagrams of two overlapping fragments each
	fragIncomplete  = 2000 // datagrams of one fragment each, never completed
)

// syn: SYNs to floodTCPPorts distinct addresses and ports, the first
// half silent (they hold a slot until the neighbour is given up, more
// than the table has), the second half refused at once.
func (f *floodRound) syn() {
	t := f.t
	before := metrics(t, f.r)
	drop0 := guestTxDropped(t, f.r)
	v0 := f.stream.Verified()
	sent, err := f.fl.SYNFlood(floodTCPPorts, floodRate, uint16(20000+f.round*floodTCPPorts%20000))
	if err != nil {
		t.Fatal(err)
	}
	dropped := guestTxDropped(t, f.r) - drop0
	d := f.settle("syn", before, func(d func(string, ...string) float64) bool {
		return d("vunet_tcp_connects_total")+d("vunet_tcp_connect_failures_total", `reason="table_full"`) >= float64(sent)-dropped
	})
	connects, full := d("vunet_tcp_connects_total"), d("vunet_tcp_connect_failures_total", `reason="table_full"`)
	t.Logf("round %d, SYN flood: %d SYNs (%v dropped by the TAP), %v host connects, %v refused for a full table, %v connect failures, %v RSTs to the guest",
		f.round, sent, dropped, connects, full, d("vunet_tcp_connect_failures_total"), d("vunet_tcp_resets_sent_total"))
	if got := connects + full; got < float64(sent)-dropped || got > float64(sent) {
		t.Errorf("round %d: %v SYNs counted (connects + table full), want %d (less the %v the TAP dropped)", f.round, got, sent, dropped)
	}
	if full == 0 {
		t.Errorf("round %d: the table never filled (%d silent destinations, 4096 slots): the cap was not exercised", f.round, floodTCPPorts/2)
	}
	// Every connection goes again (refused, given up, or reset by the
	// guest kernel, which never made it): the table drains back to the
	// stream's one connection.
	m := waitMetric(f.t, f.r, 30*time.Second, func(m Metrics) bool {
		return m.Sum("vunet_tcp_connections") == 1
	})
	if n := m.Sum("vunet_tcp_connections"); n != 1 {
		t.Errorf("round %d: %v TCP connections left after the SYN flood, want 1 (the stream)", f.round, n)
	}
	// Each refused SYN got its RST, or one counted as dropped for want of
	// RX buffers.
	rsts := m.Sum("vunet_tcp_resets_sent_total") - before.Sum("vunet_tcp_resets_sent_total")
	lost := m.Sum("vunet_queue_drops_total", `reason="pending_overflow"`) - before.Sum("vunet_queue_drops_total", `reason="pending_overflow"`)
	t.Logf("round %d, SYN flood drained: %v RSTs to the guest, %v dropped (RX ring full), %v connect failures", f.round, rsts, lost,
		m.Sum("vunet_tcp_connect_failures_total")-before.Sum("vunet_tcp_connect_failures_total"))
	if rsts+lost < full {
		t.Errorf("round %d: %v RSTs sent or counted as dropped for %v SYNs refused", f.round, rsts+lost, full)
	}
	f.progressed("SYN flood", v0)
}

// udp: datagrams to floodUDPPorts distinct ports of a local address, each
// a new flow: the guest's quota of flows holds by evicting the oldest.
func (f *floodRound) udp() {
	t := f.t
	before := metrics(t, f.r)
	drop0 := guestTxDropped(t, f.r)
	v0 := f.stream.Verified()
	sent, err := f.fl.UDPFlood(floodUDPPorts, floodRate)
	if err != nil {
		t.Fatal(err)
	}
	dropped := guestTxDropped(t, f.r) - drop0
	out := `direction="from_guest"`
	d := f.settle("udp", before, func(d func(string, ...string) float64) bool {
		return d("vunet_udp_datagrams_total", out)+d("vunet_udp_drops_total", out) >= float64(sent)-dropped
	})
	got, drops, evicted := d("vunet_udp_datagrams_total", out), d("vunet_udp_drops_total", out), d("vunet_flows_evicted_total", `protocol="udp"`)
	m := metrics(t, f.r)
	t.Logf("round %d, UDP flood: %d datagrams (%v dropped by the TAP), %v sent from host sockets, %v dropped (counted), %v flows evicted, %v UDP flows live",
		f.round, sent, dropped, got, drops, evicted, m.Sum("vunet_flows", `protocol="udp"`))
	if got+drops < float64(sent)-dropped || got+drops > float64(sent) {
		t.Errorf("round %d: %v datagrams counted (sent + dropped), want %d (less the %v the TAP dropped)", f.round, got+drops, sent, dropped)
	}
	if live := m.Sum("vunet_flows", `protocol="udp"`); live > 1024 {
		t.Errorf("round %d: %v UDP flows live, above the quota of 1024", f.round, live)
	}
	if evicted < float64(floodUDPPorts-1024)-dropped {
		t.Errorf("round %d: %v flows evicted for %d new flows in a quota of 1024", f.round, evicted, floodUDPPorts)
	}
	f.progressed("UDP flood", v0)
}

// frag: fragments that overlap (a datagram's second fragment overlaps its
// first) and fragments of datagrams that never complete: each is taken
// into the four reassembly buffers, the overlapping ones discard their
// datagram, the others are pushed out by newer ones.
func (f *floodRound) frag() {
	t := f.t
	before := metrics(t, f.r)
	drop0 := guestTxDropped(t, f.r)
	v0 := f.stream.Verified()
	sent, err := f.fl.FragFlood(fragOverlapping, fragIncomplete, floodRate, uint16(f.round*(fragOverlapping+fragIncomplete)))
	if err != nil {
		t.Fatal(err)
	}
	dropped := guestTxDropped(t, f.r) - drop0
	frag := "vunet_ip_fragments_total"
	d := f.settle("frag", before, func(d func(string, ...string) float64) bool {
		return d(frag, `outcome="received"`)+d(frag, `outcome="overlap"`) >= float64(sent)-dropped
	})
	recv, overlap, evicted, reasm := d(frag, `outcome="received"`), d(frag, `outcome="overlap"`), d(frag, `outcome="evicted"`), d(frag, `outcome="reassembled"`)
	t.Logf("round %d, fragment flood: %d fragments (%v dropped by the TAP), %v received, %v overlapping, %v datagrams evicted, %v reassembled",
		f.round, sent, dropped, recv, overlap, evicted, reasm)
	if recv+overlap < float64(sent)-dropped || recv+overlap > float64(sent) {
		t.Errorf("round %d: %v fragments counted (received + overlapping), want %d (less the %v the TAP dropped)", f.round, recv+overlap, sent, dropped)
	}
	if reasm != 0 {
		t.Errorf("round %d: %v datagrams reassembled from fragments that never complete", f.round, reasm)
	}
	if want := float64(fragOverlapping) - dropped; overlap < want {
		t.Errorf("round %d: %v overlapping fragments counted, want %v", f.round, overlap, want)
	}
	// Each never-completed datagram but the last four (still held) was
	// pushed out of the pool by a newer one.
	if want := float64(fragIncomplete-4) - dropped; evicted < want {
		t.Errorf("round %d: %v partial datagrams evicted, want %v or more", f.round, evicted, want)
	}
	f.progressed("fragment flood", v0)
}

// link: ARP, NDP and DHCP requests at floodLinkRate a second each, every
// one answered (or, if the guest did not take the answers in time,
// counted as a reply dropped from the pending ring).
func (f *floodRound) link() {
	t := f.t
	before := metrics(t, f.r)
	drop0 := guestTxDropped(t, f.r)
	v0 := f.stream.Verified()
	n := floodLinkRate * floodLinkSecs
	sent, err := f.fl.LinkFlood(n, floodLinkRate, uint8(f.round))
	if err != nil {
		t.Fatal(err)
	}
	dropped := guestTxDropped(t, f.r) - drop0
	svc := "vunet_service_replies_total"
	overflow := `reason="pending_overflow"`
	unanswered := `reason="unanswered"`
	d := f.settle("link", before, func(d func(string, ...string) float64) bool {
		return d(svc, `service="arp"`)+d(svc, `service="dhcp"`)+d(svc, `service="ndp"`)+d("vunet_queue_drops_total", unanswered) >= float64(sent)-dropped
	})
	arp, dhcp, ndp := d(svc, `service="arp"`), d(svc, `service="dhcp"`), d(svc, `service="ndp"`)
	lost, unans := d("vunet_queue_drops_total", overflow), d("vunet_queue_drops_total", unanswered)
	t.Logf("round %d, link flood: %d requests (%d each of ARP, NS, DHCPDISCOVER; %v dropped by the TAP), replies: %v ARP, %v NDP, %v DHCP (%v of them dropped from the pending ring: the guest's RX ring was full), %v unanswered",
		f.round, sent, n, dropped, arp, ndp, dhcp, lost, unans)
	// Each request is answered (the periodic RA may add one), or counted
	// as asking nothing we answer.
	if got := arp + dhcp + ndp + unans; got < float64(sent)-dropped || got > float64(sent)+1 {
		t.Errorf("round %d: %v requests answered or counted as unanswered, want %d (less the %v the TAP dropped)", f.round, got, sent, dropped)
	}
	if arp < float64(n)-dropped || dhcp < float64(n)-dropped || ndp < float64(n)-dropped {
		t.Errorf("round %d: %v ARP, %v DHCP and %v NDP replies for %d requests of each", f.round, arp, dhcp, ndp, n)
	}
	f.progressed("link-service flood", v0)
}

// waitMetric scrapes r until pred holds or d passes and returns the last
// scrape (the caller checks it).
func waitMetric(t testing.TB, r *Rig, d time.Duration, pred func(Metrics) bool) Metrics {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		m := metrics(t, r)
		if pred(m) || time.Now().After(deadline) {
			return m
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRigGuestFloods: the guest floods the back-end with SYNs to 10,000
// distinct addresses and ports, UDP to 10,000 ports, overlapping and
// never-completed fragments and 5,000 ARP, NDP and DHCP requests a
// second each, while it downloads a byte stream from a host peer. The
// caps hold (the TCP table refuses what does not fit, the UDP flows stay
// within their quota, the reassembly pool within its four buffers), every
// frame is counted, memory, descriptors and goroutines come back to where
// they were after the first round, and the stream progresses through
// every flood and arrives byte for byte.
func TestRigGuestFloods(t *testing.T) {
	// IPv6 too, so the Neighbor Solicitations are answered (the back-end's
	// namespace has no IPv6 route to take it from).
	r := startRig(t, Options{Backend: append(append([]string{}, DefaultBackend...),
		"--address", "fd00:213::2/64", "--gateway", "fd00:213::1")})
	if err := load.OwnPrefixes(func(name string, args ...string) error {
		_, err := r.HostExec(context.Background(), name, args...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := load.StartStream(ctx, rigStreamEnds(r), false, 20<<20)
	if err != nil {
		t.Fatal(err)
	}
	fl, err := load.NewFlooder(r.InGuest, tapName, linksvc.DefaultOurMAC, r.GuestAddr().Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	pid := r.BackendPID()
	type sample struct {
		rss        int64
		fds        int
		goroutines float64
	}
	measure := func() sample {
		m := metrics(t, r)
		return sample{load.ProcStatusKB(pid, "VmRSS"), load.ProcFDs(pid), m.Sum("go_goroutines")}
	}
	var after []sample
	for round := range 3 {
		f := &floodRound{t: t, r: r, fl: fl, stream: stream, round: round}
		f.syn()
		f.udp()
		f.frag()
		f.link()
		if t.Failed() {
			break
		}
		s := measure()
		after = append(after, s)
		t.Logf("after round %d: RSS %d kB, %d descriptors, %v goroutines; stream %d MB verified", round, s.rss, s.fds, s.goroutines, stream.Verified()>>20)
	}
	if err := stream.Stop(30 * time.Second); err != nil {
		t.Fatalf("the concurrent stream: %v", err)
	}
	t.Logf("stream: %d bytes byte-exact", stream.Verified())
	if len(after) == 3 {
		// The first round sets the level (flow tables, socket buffers, the
		// heap's size); later rounds must stay at it.
		ref := after[0]
		for i, s := range after[1:] {
			if float64(s.rss) > float64(ref.rss)*1.10+2048 {
				t.Errorf("RSS after round %d: %d kB, after round 0: %d kB (more than 10%% + 2 MiB)", i+1, s.rss, ref.rss)
			}
			if s.fds > ref.fds+2 {
				t.Errorf("descriptors after round %d: %d, after round 0: %d", i+1, s.fds, ref.fds)
			}
			if s.goroutines > ref.goroutines+2 {
				t.Errorf("goroutines after round %d: %v, after round 0: %v", i+1, s.goroutines, ref.goroutines)
			}
		}
	}
	healthy(t, r)
}

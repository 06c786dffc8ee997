package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// mtuRound brings up the kernel path and one rig per back-end at one guest
// MTU, runs every test on each in turn (kernel, vunet, peer), and tears
// them down. UDP runs in the first round, the latency, connection-rate and
// idle tests in the last.
func (r *runner) mtuRound(ctx context.Context, mtu int, first, last bool) (err error) {
	fmt.Fprintf(os.Stderr, "== MTU %d\n", mtu)
	var ts []*target
	defer func() {
		for _, t := range ts {
			if cerr := t.close(); cerr != nil {
				r.note("MTU %d %s teardown: %v", mtu, t.backend, cerr)
			}
		}
	}()
	k, err := newVethTarget(mtu)
	if err != nil {
		return fmt.Errorf("kernel veth pair: %w", err)
	}
	ts = append(ts, k)
	a, err := newAloneTarget(ctx, mtu, r.logger)
	if err != nil {
		return fmt.Errorf("rig alone: %w", err)
	}
	ts = append(ts, a)
	backends := []struct{ name, tmpl string }{{"vunet", r.s.vunet}}
	if r.s.peer != "" {
		backends = append(backends, struct{ name, tmpl string }{r.s.peerName, r.s.peer})
	}
	for _, b := range backends {
		t, err := newRigTarget(ctx, b.name, strings.Fields(b.tmpl), mtu, r.logger)
		if err != nil && b.name != "vunet" {
			// The peer is a guest here: its rows go missing, vunet's
			// still count.
			r.note("MTU %d: %v; its rows are missing from this round", mtu, err)
			continue
		}
		if err != nil {
			return err
		}
		ts = append(ts, t)
		if got := t.rig.MTU(); got != mtu {
			r.note("%s rig: guest MTU is %d, not %d", b.name, got, mtu)
		}
	}
	peaks := map[*target]*ownPeak{}
	defer func() {
		for _, p := range peaks {
			p.Stop()
		}
	}()
	for _, t := range ts {
		if t.pid() > 0 {
			peaks[t] = watchOwnRSS(t.pid())
		}
	}
	if r.s.throughput {
		if err := r.throughputRows(ctx, ts, mtu, first); err != nil {
			return err
		}
	}
	if last {
		r.latencyAndRate(ctx, ts, mtu)
	}
	for _, t := range ts {
		if t.pid() > 0 {
			r.peakRSS(t, fmt.Sprintf("peak RSS (VmHWM) after MTU %d tests", mtu))
		}
	}
	for _, t := range ts {
		if p := peaks[t]; p != nil {
			delete(peaks, t)
			r.ownRSS(t, p, fmt.Sprintf("peak RSS less shared memory, MTU %d tests", mtu))
		}
	}
	if last && r.s.idle > 0 {
		for _, t := range ts {
			if t.pid() > 0 {
				r.idle(ctx, t)
			}
		}
	}
	return nil
}

// throughputRows runs the iperf3 rows of one round on every target: TCP
// both ways with 1 and 4 streams, and UDP both ways in the first round.
func (r *runner) throughputRows(ctx context.Context, ts []*target, mtu int, first bool) error {
	for _, t := range ts {
		if err := t.startHost("iperf3", "iperf3", "-s", "-p", strconv.Itoa(iperfPort)); err != nil {
			return err
		}
	}
	for _, t := range ts {
		if err := t.waitListen(ctx, iperfPort); err != nil {
			return err
		}
	}

	for _, dir := range []struct {
		name, arrow string
		reverse     bool
	}{{"guest_to_host", "guest→host", false}, {"host_to_guest", "host→guest", true}} {
		for _, streams := range []int{1, 4} {
			label := fmt.Sprintf("TCP %s P%d MTU %d", dir.arrow, streams, mtu)
			for _, t := range ts {
				r.iperf(ctx, t, "tcp_throughput", label, dir.name, iperfSpec{seconds: r.s.seconds, streams: streams, reverse: dir.reverse})
			}
		}
	}
	if first {
		for _, dir := range []struct {
			name, arrow string
			reverse     bool
		}{{"guest_to_host", "guest→host", false}, {"host_to_guest", "host→guest", true}} {
			label := fmt.Sprintf("UDP %s %dB MTU %d", dir.arrow, udpLen, mtu)
			for _, t := range ts {
				r.iperf(ctx, t, "udp_throughput", label, dir.name, iperfSpec{seconds: r.s.seconds, streams: 1,
					reverse: dir.reverse, udp: true, udpRate: r.s.udpRate})
			}
		}
		r.udpGSORows(ctx, ts, mtu)
	}
	return nil
}

// iperf runs one iperf3 test on t and records its row.
func (r *runner) iperf(ctx context.Context, t *target, test, label, dir string, spec iperfSpec) {
	r.add(r.measureIperf(ctx, t, test, label, dir, spec))
}

// measureIperf runs one iperf3 test on t and returns its row.
func (r *runner) measureIperf(ctx context.Context, t *target, test, label, dir string, spec iperfSpec) Result {
	row := Result{Test: test, Label: label, Backend: t.backend, Direction: dir, MTU: t.mtu,
		Streams: spec.streams, Unit: "Gbit/s", HigherIsBetter: true}
	var before lossProbe
	if spec.udp {
		before = probeLoss(ctx, t)
	}
	res, err := runIperf(ctx, t, spec)
	if err != nil {
		row.Error = err.Error()
		return row
	}
	row.Value, row.Bytes = res.gbits, res.bytes
	if t.cpuPID() > 0 && res.bytes > 0 {
		row.CPUSecPerGB = ptr(res.cpu / (float64(res.bytes) / 1e9))
		if res.seconds > 0 {
			row.BackendBusy = ptr(res.cpu / res.seconds)
		}
	}
	var notes []string
	if spec.udp {
		row.LossPercent = ptr(res.lossPercent)
		notes = append(notes, fmt.Sprintf("sent %s Gbit/s, loss %.1f%%", num(res.sentGbits), res.lossPercent))
		if n := lossNote(before, probeLoss(ctx, t)); n != "" {
			notes = append(notes, n)
		}
	}
	if t.alone {
		notes = append(notes, "CPU: the rig itself (this process)")
	}
	row.Note = strings.Join(notes, "; ")
	return row
}

// rrSlices is how many turns the targets take at the latency and at the
// connection-rate test: each target runs its share of the test time in
// every turn, so a change in the machine's load shifts every row alike.
const rrSlices = 4

// latencyAndRate runs the ping-pong and connection-rate tests on every
// target with an echo server in each host namespace, the targets taking
// turns (rrSlices).
func (r *runner) latencyAndRate(ctx context.Context, ts []*target, mtu int) {
	servers := make([]*echoServer, len(ts))
	for i, t := range ts {
		s, err := startEcho(t)
		if err != nil {
			r.note("%s: %v", t.backend, err)
			continue
		}
		servers[i] = s
		defer s.close()
	}
	slice := r.s.rrTime / rrSlices
	conns := make([]*rrConn, len(ts))
	errs := make([]error, len(ts))
	for i, t := range ts {
		if servers[i] != nil {
			conns[i], errs[i] = dialRR(ctx, t)
		}
	}
	for range rrSlices {
		for i, c := range conns {
			if c != nil && errs[i] == nil {
				errs[i] = c.measure(slice)
			}
		}
	}
	l50 := fmt.Sprintf("TCP RR 1B latency p50 MTU %d", mtu)
	l99 := fmt.Sprintf("TCP RR 1B latency p99 MTU %d", mtu)
	var p99rows []Result
	p50s := map[string]float64{}
	for i, t := range ts {
		if servers[i] == nil {
			continue
		}
		var p50, p99 float64
		var n int
		err := errs[i]
		if conns[i] != nil {
			conns[i].c.Close()
			if err == nil {
				p50, p99, n, err = conns[i].quantiles()
			}
		}
		if err == nil {
			p50s[t.backend] = p50
		}
		a := Result{Test: "tcp_rr_latency_p50", Label: l50, Backend: t.backend, MTU: mtu, Value: p50, Unit: "µs"}
		b := Result{Test: "tcp_rr_latency_p99", Label: l99, Backend: t.backend, MTU: mtu, Value: p99, Unit: "µs"}
		if err != nil {
			a.Error, b.Error = err.Error(), err.Error()
		} else {
			a.Note = fmt.Sprintf("%d round trips", n)
			a.Count, b.Count = n, n
		}
		r.add(a)
		p99rows = append(p99rows, b)
	}
	for _, b := range p99rows {
		r.add(b)
	}
	for _, row := range backendShare(p50s, ts, mtu) {
		r.add(row)
	}

	counts := make([]int, len(ts))
	took := make([]time.Duration, len(ts))
	errs = make([]error, len(ts))
	for range rrSlices {
		for i, t := range ts {
			if servers[i] == nil || errs[i] != nil {
				continue
			}
			n, d, err := connectRate(ctx, t, slice)
			counts[i] += n
			took[i] += d
			errs[i] = err
		}
	}
	label := fmt.Sprintf("TCP connect/1B/close rate MTU %d", mtu)
	rates := map[string]float64{}
	for i, t := range ts {
		if servers[i] == nil {
			continue
		}
		rate := float64(counts[i]) / took[i].Seconds()
		row := Result{Test: "tcp_crr_rate", Label: label, Backend: t.backend, MTU: mtu, Value: rate,
			Unit: "conn/s", HigherIsBetter: true, Count: counts[i], Note: fmt.Sprintf("%d connections", counts[i])}
		if errs[i] != nil {
			row.Error = errs[i].Error()
		} else {
			rates[t.backend] = rate
		}
		r.add(row)
	}
	for _, row := range backendRateShare(rates, ts, mtu) {
		r.add(row)
	}
}

// peakRSS records the back-end's VmHWM so far.
func (r *runner) peakRSS(t *target, label string) {
	row := Result{Test: "peak_rss", Label: label, Backend: t.backend, MTU: t.mtu, Unit: "MiB"}
	kib, err := statusKiB(t.pid(), "VmHWM")
	if err != nil {
		row.Error = err.Error()
	}
	row.Value = float64(kib) / 1024
	r.add(row)
}

// ownRSS records the peak of the back-end's resident memory less shared
// memory over the round, from p. The front-end's rings and buffers count
// in a back-end's VmRSS and VmHWM once it has touched them (RssShmem, for
// the rig's memfd; the kernel maps neighbouring pages on a fault too), and
// a faster back-end keeps more of the rig's ring in use, so VmHWM weighs
// the front-end's memory as much as the back-end's own. What a back-end
// holds itself is RssAnon (heap, stacks, static buffers) plus RssFile (its
// program and libraries, shared with other processes running them).
func (r *runner) ownRSS(t *target, p *ownPeak, label string) {
	row := Result{Test: "own_rss", Label: label, Backend: t.backend, MTU: t.mtu, Unit: "MiB"}
	mib := func(kib int64) string { return num(float64(kib) / 1024) }
	m, n, err := p.Stop()
	if err != nil {
		// A peak that stopped short would read as the round's.
		row.Error = fmt.Sprintf("sampling ended after %d samples (peak so far %s MiB): %v", n, mib(m.ownKiB()), err)
		r.add(row)
		return
	}
	row.Value = float64(m.ownKiB()) / 1024
	row.Count = n
	row.Note = fmt.Sprintf("anonymous %s + files %s MiB, the largest of %d samples %v apart; not counted: shared memory (RssShmem) %s MiB",
		mib(m.anonKiB), mib(m.fileKiB), n, ownPeakEvery, mib(m.shmemKiB))
	if m.hugeKiB > 0 {
		row.Note += fmt.Sprintf(", hugetlbfs pages %s MiB", mib(m.hugeKiB))
	}
	r.add(row)
}

// idle opens the idle connections through t's back-end and records its RSS.
func (r *runner) idle(ctx context.Context, t *target) {
	pid := t.pid()
	if lim, err := openFilesLimit(pid); err != nil {
		r.note("%s: %v", t.backend, err)
	} else if lim < int64(r.s.idle)+64 {
		r.note("%s: open-files limit %d is below the %d idle connections (+64): expect failures", t.backend, lim, r.s.idle)
	} else {
		r.note("%s: back-end open-files limit %d (enough for %d connections)", t.backend, lim, r.s.idle)
	}
	label := fmt.Sprintf("RSS with %d idle TCP conns", r.s.idle)
	row := Result{Test: "idle_rss", Label: label, Backend: t.backend, MTU: t.mtu, Unit: "MiB"}
	res, err := idleConns(ctx, t, r.s.idle)
	if err != nil {
		row.Error = err.Error()
		r.add(row)
		return
	}
	row.Value, row.Count = float64(res.rssKiB)/1024, res.opened
	perConn := float64(res.rssKiB-res.baseKiB) * 1024 / float64(res.opened)
	row.Note = fmt.Sprintf("before %s MiB, +%s B/conn, VmHWM %s MiB", num(float64(res.baseKiB)/1024), num(perConn), num(float64(res.hwmKiB)/1024))
	if m, err := readRSSSplit(pid); err == nil {
		row.Note += fmt.Sprintf("; now %s MiB less shared memory (RssShmem %s MiB)", num(float64(m.ownKiB())/1024), num(float64(m.shmemKiB)/1024))
	}
	if res.firstErr != nil {
		row.Note = fmt.Sprintf("ONLY %d of %d opened (%v); %s", res.opened, r.s.idle, res.firstErr, row.Note)
	}
	r.add(row)
}

// backendShare derives, for every back-end, its own share of the 1-byte
// round trip: what remains of its p50 once the rig's share is taken out.
// A round trip through a back-end crosses the rig once each way (TAP read
// and TX ring for the request, RX ring and TAP write for the reply), and
// so does one through the rig alone (each frame read from one TAP, copied
// from TX ring to RX ring and written to the other TAP on the thread that
// read it: one rig thread woken per frame, as with a back-end); both
// include the kernel's own TCP round trip, which the kernel row measures.
// So the rig's share is rig alone − kernel, and a back-end's share is its
// p50 minus that, compared with the kernel's.
func backendShare(p50s map[string]float64, ts []*target, mtu int) []Result {
	k, okK := p50s["kernel"]
	a, okA := p50s[aloneName]
	if !okK || !okA {
		return nil
	}
	rigShare := a - k
	label := fmt.Sprintf("TCP RR 1B p50, back-end's share MTU %d", mtu)
	var rows []Result
	for _, t := range ts {
		v, ok := p50s[t.backend]
		if !ok || t.rig == nil || t.alone {
			continue
		}
		share := v - rigShare
		note := fmt.Sprintf("%s − rig share (%s rig alone − %s kernel) = %s; %.2f× the kernel's %s",
			num(v), num(a), num(k), num(share), share/k, num(k))
		if share <= 0 {
			// The rig alone does a subset of a back-end path's work with
			// fewer wake-ups: only noise (a loaded machine) puts it above.
			note += "; not meaningful: the rig alone took longer than this whole path (a loaded machine?)"
		}
		rows = append(rows, Result{Test: "tcp_rr_latency_p50_backend_share", Label: label, Backend: t.backend,
			MTU: mtu, Value: share, Unit: "µs", Note: note})
	}
	return rows
}

// backendRateShare derives, for every back-end, the connection rate it
// would reach if the rig cost nothing: each connection's time (1/rate)
// less the rig's share of it (rig alone − kernel, per connection, as
// backendShare does for the round trip), compared with the kernel's rate.
func backendRateShare(rates map[string]float64, ts []*target, mtu int) []Result {
	k, okK := rates["kernel"]
	a, okA := rates[aloneName]
	if !okK || !okA || k <= 0 || a <= 0 {
		return nil
	}
	rigShare := 1e6/a - 1e6/k // µs per connection
	label := fmt.Sprintf("TCP connect/1B/close, back-end's share MTU %d", mtu)
	var rows []Result
	for _, t := range ts {
		v, ok := rates[t.backend]
		if !ok || v <= 0 || t.rig == nil || t.alone {
			continue
		}
		perConn := 1e6/v - rigShare
		row := Result{Test: "tcp_crr_rate_backend_share", Label: label, Backend: t.backend, MTU: mtu,
			Unit: "conn/s", HigherIsBetter: true}
		note := fmt.Sprintf("1/(1/%s − rig share (1/%s rig alone − 1/%s kernel)): %s µs per connection",
			num(v), num(a), num(k), num(perConn))
		if perConn <= 0 {
			note += "; not meaningful: the rig alone took longer per connection than this whole path (a loaded machine?)"
		} else {
			row.Value = 1e6 / perConn
			note += fmt.Sprintf("; %.2f× the kernel's %s", row.Value/k, num(k))
		}
		row.Note = note
		rows = append(rows, row)
	}
	return rows
}

package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	rig "vunet/test/rig/lib"
)

// testpmdSection runs TCP both ways with DPDK's testpmd as the front-end
// (its virtio-user port bridged to a TAP in the guest namespace): a second,
// independent front-end with no EVENT_IDX, no offloads, MTU 1500, and a
// busy-polling core that drops what the back-end's TX ring cannot take.
// The back-ends take turns — two testpmds would spin on the same core —
// each with one rig for all its runs; testpmd's drop counter for the
// virtio-user port (frames the TX ring had no room for) goes in a note.
func (r *runner) testpmdSection(ctx context.Context) {
	if _, err := rig.TestpmdBinary(); err != nil {
		r.note("testpmd rows skipped: %v", err)
		return
	}
	fmt.Fprintln(os.Stderr, "== testpmd front-end, MTU 1500")
	backends := []struct{ name, tmpl string }{{"vunet", r.s.vunet}}
	if r.s.peer != "" {
		backends = append(backends, struct{ name, tmpl string }{r.s.peerName, r.s.peerTestpmd})
		switch {
		case r.s.peerTestpmd == r.s.peer:
		case r.s.peerTestpmd == testpmdPeer(r.s.peer):
			r.note("testpmd %s: run as %q: testpmd's TAP loses DATA_VALID, so passt must fill the TCP checksums (--pcap makes it), at the cost of a checksum and a write to the capture per frame", r.s.peerName, r.s.peerTestpmd)
		default:
			r.note("testpmd %s: run as %q (VUNET_BENCH_PEER_TESTPMD)", r.s.peerName, r.s.peerTestpmd)
		}
	}
	type run struct {
		label, dir string
		spec       iperfSpec
	}
	var runs []run
	for _, dir := range []struct {
		name, arrow string
		reverse     bool
	}{{"guest_to_host", "guest→host", false}, {"host_to_guest", "host→guest", true}} {
		for _, streams := range []int{1, 4} {
			runs = append(runs, run{fmt.Sprintf("testpmd: TCP %s P%d MTU 1500", dir.arrow, streams), dir.name,
				iperfSpec{seconds: r.s.seconds, streams: streams, reverse: dir.reverse}})
		}
	}
	rows := make([][]Result, len(runs)) // per run, one row per back-end
	for _, b := range backends {
		// testpmd sends no NET_SET_MTU: the back-end is told on its
		// command line (vunet and passt both take --mtu).
		argv := append(strings.Fields(b.tmpl), "--mtu", "{mtu}")
		t, err := startRigTarget(ctx, b.name, rig.Options{Backend: argv, Frontend: rig.FrontendTestpmd}, 1500, r.logger)
		if err != nil {
			r.note("testpmd: %v; its rows are missing", err)
			continue
		}
		err = t.startHost("iperf3", "iperf3", "-s", "-p", strconv.Itoa(iperfPort))
		if err == nil {
			err = t.waitListen(ctx, iperfPort)
		}
		for i, ru := range runs {
			row := Result{Test: "testpmd_tcp_throughput", Label: ru.label, Backend: b.name, Direction: ru.dir,
				MTU: 1500, Streams: ru.spec.streams, Unit: "Gbit/s", HigherIsBetter: true, Error: errString(err)}
			if err == nil {
				row = r.measureIperf(ctx, t, "testpmd_tcp_throughput", ru.label, ru.dir, ru.spec)
			}
			rows[i] = append(rows[i], row)
		}
		r.closeTestpmd(t)
	}
	for _, rs := range rows {
		for _, row := range rs {
			r.add(row)
		}
	}
}

// testpmdPeer is the peer's command for the testpmd rows, from its
// template for the others: a passt command (passt's own arguments) that
// writes no capture gets --pcap /dev/null, which makes passt fill the TCP
// checksums it otherwise leaves 0 under DATA_VALID; testpmd's TAP drops
// the flag, and with it every SYN-ACK (README, "Benchmarks"). Other
// templates are used as they are.
func testpmdPeer(tmpl string) string {
	fs := strings.Fields(tmpl)
	i := passtIndex(fs)
	if i < 0 || slices.ContainsFunc(fs[i+1:], func(f string) bool {
		return strings.HasPrefix(f, "-p") || strings.HasPrefix(f, "--pcap")
	}) {
		return tmpl
	}
	return tmpl + " --pcap /dev/null"
}

// passtIndex is the index of passt's program among a command's fields
// (after a wrapper such as taskset or numactl, if any), or -1: the first
// field that names a program passt or passt.* (passt.avx2) and has
// --vhost-user after it, as every passt serving the rig has; a path that
// merely ends in passt, as an option's value, has not.
func passtIndex(fs []string) int {
	for i, f := range fs {
		name := f[strings.LastIndexByte(f, '/')+1:]
		if (name == "passt" || strings.HasPrefix(name, "passt.")) && slices.Contains(fs[i+1:], "--vhost-user") {
			return i
		}
	}
	return -1
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// closeTestpmd stops testpmd first, to read its final counters, then tears
// the rig down.
func (r *runner) closeTestpmd(t *target) {
	stats, err := t.rig.StopTestpmd()
	if err != nil {
		r.note("testpmd %s: %v", t.backend, err)
	}
	if p, ok := stats[0]; ok {
		r.note("testpmd %s: the virtio-user port put %d frames on the back-end's TX ring and dropped %d it had no room for; took %d from its RX ring",
			t.backend, p.TXPackets, p.TXDropped, p.RXPackets)
	}
	if err := t.close(); err != nil {
		r.note("testpmd %s teardown: %v", t.backend, err)
	}
}

package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	rig "vunet/test/rig/lib"
)

// lossyImpairment is the link of the lossy rows, each way, per frame (a
// GSO frame of up to 64 KiB is one frame, as on a virtio ring): what a
// netem qdisc would be asked for, which this host's kernel lacks, so the
// rig's front-end does it.
var lossyImpairment = rig.Impairment{Loss: 0.01, Reorder: 0.01, Duplicate: 0.005, Seed: 1}

// lossyMTU is the guest MTU of the lossy rows.
const lossyMTU = 1500

// lossySection runs TCP both ways over a lossy link between the guest and
// the back-end, and between the same kernel namespaces bridged by the rig
// alone with the same damage (the "kernel" row of the group: what the
// kernel's own TCP makes of the link, with no back-end in between).
func (r *runner) lossySection(ctx context.Context) {
	fmt.Fprintf(os.Stderr, "== lossy link (loss %.1f%%, reorder %.1f%%, duplicate %.1f%% each way), MTU %d\n",
		lossyImpairment.Loss*100, lossyImpairment.Reorder*100, lossyImpairment.Duplicate*100, lossyMTU)
	var ts []*target
	defer func() {
		for _, t := range ts {
			if err := t.close(); err != nil {
				r.note("lossy %s teardown: %v", t.backend, err)
			}
		}
	}()
	k, err := startRigTarget(ctx, "kernel", rig.Options{Loopback: true, Impair: lossyImpairment}, lossyMTU, r.logger)
	if err != nil {
		r.note("lossy link: kernel (rig alone): %v; the group has no reference row", err)
	} else {
		k.alone = true
		k.listenIP = k.serverIP
		ts = append(ts, k)
	}
	backends := []struct{ name, tmpl string }{{"vunet", r.s.vunet}}
	if r.s.peer != "" {
		backends = append(backends, struct{ name, tmpl string }{r.s.peerName, r.s.peer})
	}
	for _, b := range backends {
		t, err := startRigTarget(ctx, b.name, rig.Options{Backend: strings.Fields(b.tmpl), Impair: lossyImpairment}, lossyMTU, r.logger)
		if err != nil {
			r.note("lossy link: %v; its rows are missing", err)
			continue
		}
		ts = append(ts, t)
	}
	for _, t := range ts {
		err := t.startHost("iperf3", "iperf3", "-s", "-p", strconv.Itoa(iperfPort))
		if err == nil {
			err = t.waitListen(ctx, iperfPort)
		}
		if err != nil {
			r.note("lossy %s: %v", t.backend, err)
		}
	}
	for _, dir := range []struct {
		name, arrow string
		reverse     bool
	}{{"guest_to_host", "guest→host", false}, {"host_to_guest", "host→guest", true}} {
		for _, streams := range []int{1, 4} {
			label := fmt.Sprintf("lossy link: TCP %s P%d MTU %d", dir.arrow, streams, lossyMTU)
			for _, t := range ts {
				row := r.measureIperf(ctx, t, "lossy_tcp_throughput", label, dir.name,
					iperfSpec{seconds: r.s.seconds, streams: streams, reverse: dir.reverse})
				if t.alone {
					row.Note = joinNote(row.Note, "kernel ↔ rig alone ↔ kernel, same damage")
				}
				r.add(row)
			}
		}
	}
	for _, t := range ts {
		s := t.rig.Stats()
		r.note("lossy link, %s: frames damaged to the back-end side %d lost, %d reordered, %d duplicated of %d; to the guest %d lost, %d reordered, %d duplicated of %d",
			t.backend, s.Impaired[0].Lost.Load(), s.Impaired[0].Reordered.Load(), s.Impaired[0].Duplicated.Load(), s.Impaired[0].Frames.Load(),
			s.Impaired[1].Lost.Load(), s.Impaired[1].Reordered.Load(), s.Impaired[1].Duplicated.Load(), s.Impaired[1].Frames.Load())
	}
}

package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// finalize fills the derived columns: fraction of the kernel ceiling for
// throughput rows, and vunet/peer ratios.
func finalize(rs []Result, peer string) {
	byLabel := map[string]map[string]*Result{}
	for i := range rs {
		r := &rs[i]
		if r.Error != "" {
			continue
		}
		if byLabel[r.Label] == nil {
			byLabel[r.Label] = map[string]*Result{}
		}
		byLabel[r.Label][r.Backend] = r
	}
	for i := range rs {
		r := &rs[i]
		if r.Error != "" {
			continue
		}
		g := byLabel[r.Label]
		if k := g["kernel"]; k != nil && r.Backend != "kernel" && r.Unit == "Gbit/s" && k.Value > 0 {
			r.KernelFraction = ptr(r.Value / k.Value)
		}
		// A back-end that was idle part of the run did not set its pace:
		// the guest side (kernel, front-end) did, and its ratio to a peer
		// says little about either back-end.
		// Over the lossy link loss recovery sets the pace, not the guest.
		// A latency row's busy share is its cost, not its pace.
		if r.BackendBusy != nil && r.Unit == "Gbit/s" && r.Backend != aloneName && r.Backend != "kernel" && r.Test != "lossy_tcp_throughput" && *r.BackendBusy < guestBound {
			r.Note = joinNote(r.Note, fmt.Sprintf("guest-bound (back-end busy %.0f%% of a core)", *r.BackendBusy*100))
		}
		if r.Backend != "vunet" || peer == "" {
			continue
		}
		if p := g[peer]; p != nil {
			if p.Value > 0 {
				r.RatioToPeer = ptr(r.Value / p.Value)
			}
			if r.CPUSecPerGB != nil && p.CPUSecPerGB != nil && *p.CPUSecPerGB > 0 {
				r.CPURatioToPeer = ptr(*r.CPUSecPerGB / *p.CPUSecPerGB)
			}
		}
	}
}

// guestBound is the share of one core below which a back-end's
// throughput row counts as set by the guest side: vunet and passt move a
// queue pair on one thread, so a back-end that had work all the time would
// be near 100%.
const guestBound = 0.8

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 100 || v <= -100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10 || v <= -10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func opt(p *float64, f func(float64) string) string {
	if p == nil {
		return ""
	}
	return f(*p)
}

// printTable writes the results grouped by test, the kernel first, each
// back-end right after.
func printTable(w io.Writer, rs []Result, peer string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	hdr := []string{"TEST", "BACKEND", "VALUE", "UNIT", "OF KERNEL", "CPU s/GB"}
	if peer != "" {
		hdr = append(hdr, "VUNET/"+strings.ToUpper(peer), "CPU VUNET/"+strings.ToUpper(peer))
	}
	hdr = append(hdr, "NOTE")
	fmt.Fprintln(tw, strings.Join(hdr, "\t"))
	last := ""
	for _, r := range rs {
		label := ""
		if r.Label != last {
			label = r.Label
			last = r.Label
		}
		unit := r.Unit
		if !r.HigherIsBetter {
			unit += " (lower=better)"
		}
		val := num(r.Value)
		note := r.Note
		if r.Error != "" {
			val, note = "ERROR", r.Error
		}
		cols := []string{label, r.Backend, val, unit,
			opt(r.KernelFraction, func(v float64) string { return fmt.Sprintf("%.0f%%", v*100) }),
			opt(r.CPUSecPerGB, num)}
		if peer != "" {
			cols = append(cols, opt(r.RatioToPeer, func(v float64) string { return fmt.Sprintf("%.2f", v) }),
				opt(r.CPURatioToPeer, func(v float64) string { return fmt.Sprintf("%.2f", v) }))
		}
		cols = append(cols, note)
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	tw.Flush()
}

// printMicro writes the Go micro-benchmarks, one line each.
func printMicro(w io.Writer, ms []MicroResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PACKAGE\tBENCHMARK\tns/op\tB/op\tallocs/op\tOTHER\t")
	for _, m := range ms {
		var extra []string
		keys := make([]string, 0, len(m.Extra))
		for k := range m.Extra {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			extra = append(extra, num(m.Extra[k])+" "+k)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", strings.TrimPrefix(m.Package, "vunet/"), m.Name,
			num(m.NsPerOp), num(m.BytesPerOp), num(m.AllocsPerOp), strings.Join(extra, ", "))
	}
	tw.Flush()
}

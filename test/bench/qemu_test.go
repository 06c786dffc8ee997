package main

import (
	"strings"
	"testing"
)

// The QEMU rounds' rows become one row per back-end and test: each number
// the median of the rounds that worked, in the order the rows first came,
// with every round's value and CPU per GB in the note; a test that failed
// in every round keeps its error.
func TestGroupQEMURows(t *testing.T) {
	row := func(be, test string, v, cpu float64, errText string) qemuRow {
		q := qemuRow{Backend: be, Test: test, Value: v, Unit: "Gbit/s", CPUSecPerGB: cpu, CPUSeconds: cpu * 0.3, Seconds: 10, Error: errText}
		if test == "download" {
			q.Bytes = 300e6
		}
		return q
	}
	rows := []qemuRow{
		row("vunet", "download", 0.30, 1.2, ""), row("vunet", "rr_p50", 400, 0, ""),
		row("passt", "download", 0.20, 0.9, ""), row("passt", "rr_p50", 0, 0, "no result"),
		row("vunet", "download", 0.34, 0.8, ""), row("vunet", "rr_p50", 380, 0, ""),
		row("passt", "download", 0.33, 1.1, ""), row("passt", "rr_p50", 0, 0, "no result"),
		row("vunet", "download", 0, 0, "timed out"), row("vunet", "rr_p50", 390, 0, ""),
		row("passt", "download", 0.31, 1.0, ""), row("passt", "rr_p50", 0, 0, "no result"),
	}
	gs := groupQEMURows(rows)
	want := []struct {
		be, test string
		v, cpu   float64
		n        int
		err      string
	}{
		{"vunet", "download", 0.32, 1.0, 2, ""},
		{"vunet", "rr_p50", 390, 0, 3, ""},
		{"passt", "download", 0.31, 1.0, 3, ""},
		{"passt", "rr_p50", 0, 0, 0, "no result"},
	}
	if len(gs) != len(want) {
		t.Fatalf("%d groups, want %d", len(gs), len(want))
	}
	for i, w := range want {
		g := gs[i]
		m := g.median
		if m.Backend != w.be || m.Test != w.test || len(g.rounds) != w.n || m.Error != w.err {
			t.Fatalf("group %d: %s %s, %d rounds, error %q; want %s %s, %d, %q", i, m.Backend, m.Test, len(g.rounds), m.Error, w.be, w.test, w.n, w.err)
		}
		if d := m.Value - w.v; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s %s: median %v, want %v", w.be, w.test, m.Value, w.v)
		}
		if d := m.CPUSecPerGB - w.cpu; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s %s: median CPU %v, want %v", w.be, w.test, m.CPUSecPerGB, w.cpu)
		}
	}
	if n := gs[2].note(); !strings.Contains(n, "median of 3 rounds: 0.20, 0.33, 0.31") || !strings.Contains(n, "CPU s/GB 0.90, 1.10, 1.00") {
		t.Errorf("note %q: want every round's value and CPU per GB", n)
	}
	if n := gs[3].note(); n != "" {
		t.Errorf("a group with no round that worked has the note %q", n)
	}
}

// The round-trip row's busy share is the median of each round's CPU over
// wall time, with every round's in the note; a round that measured none
// is left out, and the share does not make the row "guest-bound" (that
// note is about what set a throughput row's pace).
func TestQEMURRBusy(t *testing.T) {
	rr := func(cpu, secs float64) qemuRow {
		return qemuRow{Backend: "passt", Test: "rr_p50", Value: 300, Unit: "µs", CPUSeconds: cpu, Seconds: secs}
	}
	g := groupQEMURows([]qemuRow{rr(3.6, 4), rr(0.8, 4), rr(1, 0), rr(3.4, 4)})[0]
	busy, each, ok := g.busy()
	if d := busy - 0.85; !ok || d > 1e-9 || d < -1e-9 {
		t.Errorf("busy %v (%v), want 0.85 (the median of 0.90, 0.20, 0.85)", busy, ok)
	}
	if got, want := strings.Join(each, ", "), "90%, 20%, 85%"; got != want {
		t.Errorf("rounds' shares %q, want %q", got, want)
	}
	if _, _, ok := (qemuGroup{rounds: []qemuRow{rr(1, 0)}}).busy(); ok {
		t.Error("no round measured, but a share")
	}
	rs := []Result{{Label: "rr", Backend: "vunet", Value: 360, Unit: "µs", BackendBusy: ptr(0.17)}}
	finalize(rs, "")
	if strings.Contains(rs[0].Note, "guest-bound") {
		t.Errorf("latency row noted %q", rs[0].Note)
	}
}

// A throughput row's wake-ups per GB are the median of each round's
// voluntary context switches over its bytes, with every round's in the
// note; a round that counted none is left out, and a row without bytes
// (the round trips) has none.
func TestQEMUWakeups(t *testing.T) {
	dl := func(sleeps int64) qemuRow {
		return qemuRow{Backend: "vunet", Test: "download", Value: 0.3, Unit: "Gbit/s", Bytes: 300e6, Sleeps: sleeps}
	}
	// Four counted rounds: an even count's median is the mean of the
	// middle two, which neither the last round nor the mean of all is.
	g := groupQEMURows([]qemuRow{dl(3900), dl(2700), dl(0), dl(3300), dl(3000)})[0]
	w, each, ok := g.wakeups()
	if d := w - 10500; !ok || d > 1e-6 || d < -1e-6 {
		t.Errorf("wake-ups %v/GB (%v), want 10500 (the median of 13000, 9000, 11000, 10000)", w, ok)
	}
	if got, want := strings.Join(each, ", "), "13000, 9000, 11000, 10000"; got != want {
		t.Errorf("rounds' wake-ups %q, want %q", got, want)
	}
	rr := qemuRow{Backend: "vunet", Test: "rr_p50", Value: 300, Unit: "µs", Sleeps: 500}
	if _, _, ok := groupQEMURows([]qemuRow{rr})[0].wakeups(); ok {
		t.Error("a row without bytes has wake-ups per GB")
	}
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// qemuRow is what test/bench/qemuvm writes per measurement.
type qemuRow struct {
	Backend     string  `json:"backend"`
	Test        string  `json:"test"`
	Value       float64 `json:"value"`
	Unit        string  `json:"unit"`
	Bytes       int64   `json:"bytes"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	CPUSecPerGB float64 `json:"cpu_s_per_gb"`
	Seconds     float64 `json:"seconds"`
	Count       int     `json:"count"`
	Error       string  `json:"error"`
	// Sleeps is the back-end's voluntary context switches over the row
	// (all its threads): each is a wake-up, and under a VM a wake-up costs
	// a large part of what a slow transfer's CPU is made of.
	Sleeps int64 `json:"sleeps"`
}

// qemuSection runs the QEMU guest benchmark (package test/bench/qemuvm)
// with vunet and, if set, the peer: a TCG guest downloads and uploads
// s.qemuBytes through each back-end and times 1-byte round trips; the
// back-end's CPU per GB is what a VM user pays.
func (r *runner) qemuSection(ctx context.Context, root string) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		r.note("QEMU rows skipped: qemu-system-x86_64 not found (apt-get install qemu-system-x86)")
		return
	}
	fmt.Fprintf(os.Stderr, "== QEMU guest (TCG), %d MB each way, %d rounds\n", r.s.qemuBytes/1e6, max(r.s.qemuRounds, 1))
	type backend struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	// The rig's metrics and flow-table flags mean nothing here; the
	// templates are run as they are otherwise.
	// Rounds interleave the back-ends: on a shared machine a VM's CPU
	// time per GB moves by tens of percent from one run to the next, and
	// a slow spell then hits both back-ends rather than one.
	rounds := max(r.s.qemuRounds, 1)
	var bs []backend
	for range rounds {
		bs = append(bs, backend{"vunet", r.s.vunet})
		if r.s.peer != "" {
			bs = append(bs, backend{r.s.peerName, r.s.peer})
		}
	}
	spec, _ := json.Marshal(bs)
	out := filepath.Join(os.TempDir(), fmt.Sprintf("vunet-bench-qemu-%d.json", os.Getpid()))
	defer os.Remove(out)
	timeout := time.Duration(len(bs)) * (10*time.Minute + time.Duration(r.s.qemuBytes/1e6)*2*time.Second)
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-run", "^$", "-bench", "^BenchmarkQEMUGuest$",
		"-benchtime", "1x", "-timeout", timeout.String(), "./test/bench/qemuvm")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "VUNET_BENCH_QEMU_OUT="+out, "VUNET_BENCH_QEMU_BACKENDS="+string(spec),
		"VUNET_BENCH_QEMU_BYTES="+strconv.FormatInt(r.s.qemuBytes, 10), "VUNET_BENCH_QEMU_RR="+r.s.rrTime.String())
	log, err := cmd.CombinedOutput()
	raw, rerr := os.ReadFile(out)
	if rerr != nil {
		r.note("QEMU section failed: %v %v\n%s", err, rerr, tailLines(string(log), 40))
		return
	}
	if err != nil {
		// A round that failed leaves its rows out; the other rounds'
		// rows are in the file and still count.
		r.note("QEMU section: a round failed, its rows are missing: %v\n%s", err, tailLines(string(log), 40))
	}
	var rows []qemuRow
	if err := json.Unmarshal(raw, &rows); err != nil {
		r.note("QEMU section: %v", err)
		return
	}
	mb := r.s.qemuBytes / 1e6
	labels := map[string]string{
		"download": fmt.Sprintf("QEMU TCG guest: TCP download %d MB", mb),
		"upload":   fmt.Sprintf("QEMU TCG guest: TCP upload %d MB", mb),
		"rr_p50":   "QEMU TCG guest: TCP RR 1B latency p50",
		"rr_p99":   "QEMU TCG guest: TCP RR 1B latency p99",
	}
	for _, g := range groupQEMURows(rows) {
		q := g.median
		res := Result{Test: "qemu_" + q.Test, Label: labels[q.Test], Backend: q.Backend, Value: q.Value,
			Unit: q.Unit, Bytes: q.Bytes, Count: q.Count, Error: q.Error, Note: g.note()}
		switch q.Test {
		case "download", "upload":
			res.HigherIsBetter = true
			res.Direction = map[string]string{"download": "host_to_guest", "upload": "guest_to_host"}[q.Test]
			if q.Bytes > 0 {
				res.CPUSecPerGB = ptr(q.CPUSecPerGB)
			}
			if busy, _, ok := g.busy(); ok {
				res.BackendBusy = ptr(busy)
			}
			if w, each, ok := g.wakeups(); ok {
				res.Note = joinNote(res.Note, fmt.Sprintf("wake-ups %s/GB", num(w))+eachRound(each))
			}
		case "rr_p50":
			res.Note = joinNote(fmt.Sprintf("%d round trips", q.Count), res.Note)
			// What the latency cost: a back-end that spins between
			// requests answers sooner and burns a core doing it.
			if busy, each, ok := g.busy(); ok {
				res.BackendBusy = ptr(busy)
				note := fmt.Sprintf("back-end busy %.0f%% of a core over the round trips", 100*busy)
				res.Note = joinNote(res.Note, note+eachRound(each))
			}
		}
		r.add(res)
	}
}

// qemuGroup is one back-end's rows of one test over the rounds.
type qemuGroup struct {
	median qemuRow   // each number the median of the rounds'
	rounds []qemuRow // in round order, the failed ones left out
}

// groupQEMURows groups the rows by back-end and test, in their first
// order. A group whose every round failed keeps the first failure.
func groupQEMURows(rows []qemuRow) []qemuGroup {
	type key struct{ backend, test string }
	at := map[key]int{}
	var gs []qemuGroup
	for _, q := range rows {
		k := key{q.Backend, q.Test}
		i, seen := at[k]
		if !seen {
			i = len(gs)
			at[k] = i
			gs = append(gs, qemuGroup{median: q}) // the first failure, if no round works
		}
		if q.Error == "" {
			gs[i].rounds = append(gs[i].rounds, q)
		}
	}
	for i := range gs {
		rs := gs[i].rounds
		if len(rs) == 0 {
			continue
		}
		m := rs[0]
		m.Value = median(rs, func(q qemuRow) float64 { return q.Value })
		m.CPUSeconds = median(rs, func(q qemuRow) float64 { return q.CPUSeconds })
		m.CPUSecPerGB = median(rs, func(q qemuRow) float64 { return q.CPUSecPerGB })
		m.Seconds = median(rs, func(q qemuRow) float64 { return q.Seconds })
		gs[i].median = m
	}
	return gs
}

// note says what the median was taken of: each round's value, and its
// CPU per GB where there is one.
func (g qemuGroup) note() string {
	if len(g.rounds) < 2 {
		return ""
	}
	vals := make([]string, len(g.rounds))
	cpus := make([]string, len(g.rounds))
	for i, q := range g.rounds {
		vals[i] = num(q.Value)
		cpus[i] = num(q.CPUSecPerGB)
	}
	n := fmt.Sprintf("median of %d rounds: %s", len(g.rounds), strings.Join(vals, ", "))
	if g.median.Bytes > 0 {
		n += "; CPU s/GB " + strings.Join(cpus, ", ")
	}
	return n
}

// busy is the median over the rounds of the back-end's CPU time over
// wall time (the median of the rounds' shares: a ratio of medians can be
// none of them), with each round's share formatted; ok is false when no
// round measured it.
func (g qemuGroup) busy() (share float64, each []string, ok bool) {
	of := func(q qemuRow) float64 { return q.CPUSeconds / q.Seconds }
	var rs []qemuRow
	for _, q := range g.rounds {
		if q.Seconds > 0 && q.CPUSeconds >= 0 {
			rs = append(rs, q)
			each = append(each, fmt.Sprintf("%.0f%%", 100*of(q)))
		}
	}
	if len(rs) == 0 {
		return 0, nil, false
	}
	return median(rs, of), each, true
}

// wakeups is the median over the rounds of the back-end's voluntary
// context switches per 10⁹ bytes moved, with each round's formatted; ok is
// false when no round counted them (a row without bytes, or a count the
// bench could not read).
//
// Under a guest that sets the pace, a transfer's wake-ups are the guest's
// doing as much as the back-end's: each frame the guest sends after a
// quiet spell (an ACK, a window update) wakes the back-end, which then
// spends a context switch and its per-wake-up system calls on it. Beside
// the CPU per GB, the count says whether a back-end spends more because it
// wakes more often or because each wake-up costs it more.
func (g qemuGroup) wakeups() (perGB float64, each []string, ok bool) {
	of := func(q qemuRow) float64 { return float64(q.Sleeps) / (float64(q.Bytes) / 1e9) }
	var rs []qemuRow
	for _, q := range g.rounds {
		if q.Bytes > 0 && q.Sleeps > 0 {
			rs = append(rs, q)
			each = append(each, num(of(q)))
		}
	}
	if len(rs) == 0 {
		return 0, nil, false
	}
	return median(rs, of), each, true
}

// eachRound is the suffix that gives every round's figure after a median,
// none when there was only one.
func eachRound(each []string) string {
	if len(each) < 2 {
		return ""
	}
	return " (" + strings.Join(each, ", ") + ")"
}

// median is the median of f over rs (the mean of the middle two for an
// even count).
func median(rs []qemuRow, f func(qemuRow) float64) float64 {
	v := make([]float64, len(rs))
	for i, q := range rs {
		v[i] = f(q)
	}
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

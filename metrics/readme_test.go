package metrics

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/stats"
	"vunet/vhostuser"
)

// readmeRow is one row of README's metrics table.
type readmeRow struct {
	kind, labels, help string
}

// readmeMetrics parses the table under README's "## Metrics" heading:
// | `name` | type | labels | meaning |.
func readmeMetrics(t *testing.T) map[string]readmeRow {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Metrics\n")
	if !ok {
		t.Fatal(`README has no "## Metrics" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string]readmeRow{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 4 || !strings.HasPrefix(cells[0], "`vunet_") {
			continue
		}
		name := strings.Trim(cells[0], "`")
		if _, dup := rows[name]; dup {
			t.Errorf("README lists %s twice", name)
		}
		// Labels in any order: README writes them as declared.
		labels := strings.Split(cells[2], ", ")
		slices.Sort(labels)
		rows[name] = readmeRow{kind: cells[1], labels: strings.Join(labels, ", "), help: cells[3]}
	}
	if len(rows) == 0 {
		t.Fatal("README's metrics table has no rows")
	}
	return rows
}

// everySeries makes every family show at least one series: sparse ones
// (drop reasons, requests, flow moves) appear only once non-zero.
func everySeries() Sources {
	src, ctl, st, tcps := testSources(1, 0)
	for r := vhostuser.Request(0); r < vhostuser.NumRequests; r++ {
		ctl.Messages[r].Add(1)
	}
	ctl.Features.Store(1)
	ctl.ProtocolFeatures.Store(1)
	for r := stats.DropReason(0); r < stats.NumDropReasons; r++ {
		st[0].TX.Drops[r].Add(1)
		st[0].RX.Drops[r].Add(1)
		st[0].Proto.UDPDrops[stats.ToGuest][r].Add(1)
	}
	st[0].Proto.UDPUSOFrames[stats.ToGuest].Add(1)
	st[0].PolicyDrops[addrpolicy.TCP][addrpolicy.DstLoopback].Add(1)
	st[0].Flows.MovedIn[stats.FlowUDP].Add(1)
	st[0].FlowFetches.Add(1)
	st[0].FlowFetchMisses.Add(1)
	st[0].PollHits.Add(1)
	st[0].PollMisses.Add(1)
	tcps[0].OutOfOrderKept.Add(1)
	tcps[0].OutOfOrderNoBuffer.Add(1)
	for _, c := range []*atomic.Uint64{&st[0].Stream.Sessions, &st[0].Stream.Reads, &st[0].Stream.ReadBytes,
		&st[0].Stream.WriteWaits, &st[0].Stream.BadLength} {
		c.Add(1)
	}
	tcps[0].ClampAttempts.Add(1)
	tcps[0].ClampEffective.Add(1)
	tcps[0].WindowProbes.Add(1)
	tcps[0].ChallengeAcksLimited.Add(1)
	tcps[0].Retransmits[stats.TCPRetransWindow].Add(1)
	src.Forwards = &stats.Forwards{}
	src.DNSForward = true
	ctl.Rings[0].DirtyLogWrites.Add(1)
	ctl.Rings[0].DirtyLogMisses.Add(1)
	return src
}

// TestREADMEMetricsTableMatchesExposition: README's table is the operator's
// reference; every vunet_* family exported has a row with its type, labels
// and help text, and every row is exported.
func TestREADMEMetricsTableMatchesExposition(t *testing.T) {
	rows := readmeMetrics(t)
	mfs, err := NewRegistry(everySeries()).Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	var want strings.Builder
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, namespace+"_") {
			continue
		}
		exported[name] = true
		got := readmeRow{kind: strings.ToLower(mf.GetType().String()), labels: labelNames(mf), help: mf.GetHelp()}
		fmt.Fprintf(&want, "| `%s` | %s | %s | %s |\n", name, got.kind, got.labels, got.help)
		row, ok := rows[name]
		switch {
		case !ok:
			t.Errorf("%s is exported but not in README's metrics table", name)
		case row != got:
			t.Errorf("%s: README says\n\t%+v\nexposition says\n\t%+v", name, row, got)
		}
	}
	for name := range rows {
		if !exported[name] {
			t.Errorf("README lists %s, which is not exported", name)
		}
	}
	if t.Failed() {
		t.Logf("the exposition's rows (labels sorted):\n%s", want.String())
	}
}

// labelNames lists a family's label names, sorted, as README writes them
// ("—" for none).
func labelNames(mf *dto.MetricFamily) string {
	var names []string
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if !slices.Contains(names, l.GetName()) {
				names = append(names, l.GetName())
			}
		}
	}
	if len(names) == 0 {
		return "—"
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

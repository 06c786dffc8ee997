package qemu

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Metrics is one scrape of the daemon's Prometheus endpoint: sample value by
// series, the series written as name{k="v",...} with labels sorted.
type Metrics map[string]float64

// Series renders a series key the way Metrics stores it.
func Series(name string, labels ...string) string {
	if len(labels) == 0 {
		return name
	}
	pairs := make([]string, 0, len(labels)/2)
	for i := 0; i+1 < len(labels); i += 2 {
		pairs = append(pairs, labels[i]+"="+strconv.Quote(labels[i+1]))
	}
	sort.Strings(pairs)
	return name + "{" + strings.Join(pairs, ",") + "}"
}

// Get returns one series' value (0 when absent) and whether it was present.
func (m Metrics) Get(name string, labels ...string) (float64, bool) {
	v, ok := m[Series(name, labels...)]
	return v, ok
}

// Sum adds every series of name whose labels include all of the given
// label pairs, e.g. Sum("vunet_queue_frames_total", "direction", "from_guest").
func (m Metrics) Sum(name string, labels ...string) float64 {
	var want []string
	for i := 0; i+1 < len(labels); i += 2 {
		want = append(want, labels[i]+"="+strconv.Quote(labels[i+1]))
	}
	var sum float64
	for k, v := range m {
		base, rest, _ := strings.Cut(k, "{")
		if base != name {
			continue
		}
		rest = "," + strings.TrimSuffix(rest, "}") + ","
		ok := true
		for _, w := range want {
			if !strings.Contains(rest, ","+w+",") {
				ok = false
				break
			}
		}
		if ok {
			sum += v
		}
	}
	return sum
}

// NonZero renders the series of m whose value is not zero, one per line,
// sorted, without the Go runtime's and process's own (go_*, process_*,
// promhttp_*): what the daemon counted, for a failure's dump.
func (m Metrics) NonZero() string {
	var lines []string
	for k, v := range m {
		if v == 0 || strings.HasPrefix(k, "go_") || strings.HasPrefix(k, "process_") || strings.HasPrefix(k, "promhttp_") {
			continue
		}
		lines = append(lines, k+" "+strconv.FormatFloat(v, 'f', -1, 64))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// ParseMetrics reads the Prometheus text exposition format (what
// client_golang serves without content negotiation).
func ParseMetrics(r io.Reader) (Metrics, error) {
	m := Metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		key, rest, err := parseSeries(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d %q: %w", n, line, err)
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("metrics line %d %q: no value", n, line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d %q: value: %w", n, line, err)
		}
		m[key] = v
	}
	return m, sc.Err()
}

// parseSeries splits `name{a="x",b="y"} rest` into the canonical key and rest.
func parseSeries(line string) (string, string, error) {
	i := strings.IndexAny(line, "{ \t")
	if i < 0 {
		return "", "", fmt.Errorf("no value")
	}
	name := line[:i]
	if line[i] != '{' {
		return name, line[i:], nil
	}
	s := line[i+1:]
	var labels []string
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			s = s[1:]
			break
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return "", "", fmt.Errorf("bad label")
		}
		k := strings.TrimSpace(s[:eq])
		q, err := strconv.QuotedPrefix(s[eq+1:])
		if err != nil {
			return "", "", fmt.Errorf("label %s: %w", k, err)
		}
		v, err := strconv.Unquote(q)
		if err != nil {
			return "", "", fmt.Errorf("label %s: %w", k, err)
		}
		labels = append(labels, k, v)
		s = s[eq+1+len(q):]
	}
	return Series(name, labels...), s, nil
}

// Scrape fetches the daemon's metrics (DaemonConfig.Metrics must be set).
func (d *Daemon) Scrape(ctx context.Context) (Metrics, error) {
	if d.MetricsAddr == "" {
		return nil, fmt.Errorf("daemon has no metrics endpoint (set DaemonConfig.Metrics)")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.MetricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	client := http.DefaultClient
	if d.netns != nil {
		// The endpoint listens on the namespace's loopback.
		client = &http.Client{Transport: &http.Transport{DialContext: d.netns.DialContext, DisableKeepAlives: true}}
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", d.MetricsAddr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", d.MetricsAddr, resp.Status)
	}
	return ParseMetrics(resp.Body)
}

// WaitMetric scrapes until cond holds for a scrape or timeout passes, and
// returns the last scrape. Counters move asynchronously to what the guest
// reports, so a test waits for the value rather than sampling once.
func (d *Daemon) WaitMetric(timeout time.Duration, what string, cond func(Metrics) bool) (Metrics, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last Metrics
	var lastErr error
	for {
		m, err := d.Scrape(ctx)
		if err == nil {
			last = m
			if cond(m) {
				return m, nil
			}
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if last == nil {
				return nil, fmt.Errorf("metrics %s: %v", what, lastErr)
			}
			return last, fmt.Errorf("metrics: %s not reached within %v", what, timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

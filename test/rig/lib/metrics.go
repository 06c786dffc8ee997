package rig

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Metrics is one scrape of a Prometheus endpoint: value by series, written
// exactly as exposed, e.g. vunet_queue_frames_total{direction="to_guest",queue="0"}.
type Metrics map[string]float64

// Sum adds every series named name whose label set contains each of the
// given label="value" pairs (name alone sums all its series).
func (m Metrics) Sum(name string, labels ...string) float64 {
	var s float64
	for k, v := range m {
		base, rest, _ := strings.Cut(k, "{")
		if base != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				ok = false
				break
			}
		}
		if ok {
			s += v
		}
	}
	return s
}

// Has reports whether any series of name is exposed.
func (m Metrics) Has(name string) bool {
	for k := range m {
		if base, _, _ := strings.Cut(k, "{"); base == name {
			return true
		}
	}
	return false
}

// Names lists the metric names exposed (without labels), for diagnostics.
func (m Metrics) Names() []string {
	seen := map[string]bool{}
	var out []string
	for k := range m {
		base, _, _ := strings.Cut(k, "{")
		if !seen[base] {
			seen[base] = true
			out = append(out, base)
		}
	}
	return out
}

// Metrics scrapes the back-end's metrics endpoint (Options.MetricsAddr,
// inside the back-end's namespace).
func (r *Rig) Metrics(ctx context.Context) (Metrics, error) {
	var conn net.Conn
	err := r.InHost(func() error {
		var err error
		conn, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", r.opts.MetricsAddr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("metrics at %s: %w", r.opts.MetricsAddr, err)
	}
	// The connection was made inside the namespace; hand it to the client.
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+r.opts.MetricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Close = true
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", r.opts.MetricsAddr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", r.opts.MetricsAddr, resp.Status)
	}
	m := Metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

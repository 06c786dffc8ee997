package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
	"vunet/test/testenv"
)

const prometheusHint = "apt-get install prometheus"

// TestPrometheusScrapesVunet runs a real Prometheus server that scrapes
// vunet's --metrics endpoint every second while a QEMU guest gets a lease
// and downloads a blob through vunet, then asks Prometheus (its HTTP query
// API, as a dashboard would) whether vunet_queue_frames_total and
// vunet_queue_bytes_total rose in both directions by at least what was
// transferred, and whether it sampled the download while it was in
// progress (the server paces it over about 5 s). It also lints one scrape
// with `promtool check metrics`.
func TestPrometheusScrapesVunet(t *testing.T) {
	testenv.SkipIfShort(t)
	testenv.NeedRoot(t, "network namespace for the daemon, its servers and Prometheus")
	promBin := testenv.NeedTool(t, "prometheus", "", prometheusHint)
	promtool := testenv.NeedTool(t, "promtool", "", prometheusHint)
	qemu.NeedQEMU(t)

	ns := qemu.NewNetNS(t)
	const size = 32 << 20
	// 8 chunks 700 ms apart: the download lasts about 5 s, five scrapes.
	page := startPacedPageServer(t, ns, size, 8, 700*time.Millisecond)
	d := qemu.StartDaemon(t, qemu.DaemonConfig{NetNS: ns, Metrics: true})
	client := &http.Client{Transport: &http.Transport{DialContext: ns.DialContext}, Timeout: 5 * time.Second}

	// promtool first: a lint problem is worth reporting even if the rest fails.
	raw := fetch(t, client, "http://"+d.MetricsAddr+"/metrics")
	lint := exec.Command(promtool, "check", "metrics")
	lint.Stdin = bytes.NewReader(raw)
	if out, err := lint.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}

	prom := startPrometheus(t, ns, promBin, d.MetricsAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()
	if err := prom.waitUp(ctx, client); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	before := map[string]map[string]float64{}
	for _, m := range []string{"vunet_queue_frames_total", "vunet_queue_bytes_total"} {
		v, err := prom.query(ctx, client, "sum by (direction) ("+m+")", t0)
		if err != nil {
			t.Fatal(err)
		}
		before[m] = v
	}
	t.Logf("prometheus before the guest: %v", before)

	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckHTTP},
		Params: map[string]string{
			guest.ParamHTTP:    fmt.Sprintf("http://%s:%d/blob", ns.Host.Gateway, page.Port),
			guest.ParamTimeout: "60s",
		},
		Timeout: 100 * time.Second,
	})
	r := vm.RequireResult(t, guest.CheckHTTP, 80*time.Second)
	page.checkFetched(t, r.Fields)
	vm.Finish(t)
	direct, err := d.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Prometheus has the final values once it scraped after the guest ended.
	want := map[string]map[string]float64{
		"vunet_queue_frames_total": {"from_guest": 10, "to_guest": 10},
		"vunet_queue_bytes_total":  {"from_guest": 1000, "to_guest": size},
	}
	var after map[string]map[string]float64
	for {
		after = map[string]map[string]float64{}
		short := ""
		for m, dirs := range want {
			v, err := prom.query(ctx, client, "sum by (direction) ("+m+")", time.Now())
			if err != nil {
				t.Fatal(err)
			}
			after[m] = v
			for dir, min := range dirs {
				if v[dir]-before[m][dir] < min {
					short += fmt.Sprintf(" %s{direction=%q} rose by %v, want >= %v;", m, dir, v[dir]-before[m][dir], min)
				}
			}
		}
		if short == "" {
			break
		}
		if ctx.Err() != nil || prom.exited() {
			t.Fatalf("prometheus:%s (direct scrape: frames from_guest %v to_guest %v, bytes from_guest %v to_guest %v)", short,
				direct.Sum("vunet_queue_frames_total", "direction", "from_guest"), direct.Sum("vunet_queue_frames_total", "direction", "to_guest"),
				direct.Sum("vunet_queue_bytes_total", "direction", "from_guest"), direct.Sum("vunet_queue_bytes_total", "direction", "to_guest"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("prometheus after the guest: %v", after)
	for m := range want {
		for dir, v := range after[m] {
			if own := direct.Sum(m, "direction", dir); v > own {
				t.Errorf("prometheus has %s{direction=%q} = %v, more than vunet itself reports (%v)", m, dir, v, own)
			}
		}
	}
	// The same through a range function, the way a rate panel asks.
	inc, err := prom.query(ctx, client, `sum(increase(vunet_queue_bytes_total{direction="to_guest"}[5m]))`, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if inc[""] < size {
		t.Errorf(`increase(vunet_queue_bytes_total{direction="to_guest"}[5m]) = %v, want >= %d`, inc[""], size)
	}
	// Scraped during the transfer, not just before and after it: raw
	// samples strictly between the start and the end of the download.
	samples, err := prom.samples(ctx, client, `vunet_queue_bytes_total{direction="to_guest"}[5m]`)
	if err != nil {
		t.Fatal(err)
	}
	base, final := before["vunet_queue_bytes_total"]["to_guest"], after["vunet_queue_bytes_total"]["to_guest"]
	var during []float64
	for _, v := range samples {
		if v > base+size/16 && v < final-size/16 {
			during = append(during, v)
		}
	}
	if len(during) < 2 {
		t.Errorf("prometheus scraped the transfer in progress %d times (rx bytes %v), want >= 2: samples %v", len(during), during, samples)
	}
	t.Logf("prometheus: increase of rx bytes %v; %d samples, %d of them mid-transfer: %v", inc[""], len(samples), len(during), during)
}

// prometheus is a running Prometheus server inside a test namespace.
type prometheus struct {
	*toolProcess
	base string // http://127.0.0.1:port
}

// startPrometheus runs Prometheus inside ns, scraping target every second,
// with its storage and log in the test's work directory.
func startPrometheus(t *testing.T, ns *qemu.NetNS, bin, target string) *prometheus {
	t.Helper()
	dir := qemu.WorkDir(t)
	cfg := filepath.Join(dir, "prometheus.yml")
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: vunet
    static_configs:
      - targets: [%q]
`, target)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t, ns)
	p := &prometheus{base: fmt.Sprintf("http://127.0.0.1:%d", port)}
	p.toolProcess = startTool(t, dir, "prometheus", ns.Command(bin,
		"--config.file="+cfg,
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+fmt.Sprintf("127.0.0.1:%d", port),
		"--log.level=info"))
	return p
}

// waitUp waits until Prometheus answers and has scraped the target
// successfully (up == 1).
func (p *prometheus) waitUp(ctx context.Context, c *http.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		v, err := p.query(ctx, c, `up{job="vunet"}`, time.Now())
		if err == nil && v[""] == 1 {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("up{job=\"vunet\"} = %v", v)
		}
		last = err
		if p.exited() {
			return fmt.Errorf("prometheus exited (%v): %v\n%s", p.err, last, tail(p.Log, 20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("prometheus never scraped vunet: %v\n%s", last, tail(p.Log, 20))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// query runs an instant query at time at and returns the vector's values by
// their direction label ("" for series without one).
func (p *prometheus) query(ctx context.Context, c *http.Client, q string, at time.Time) (map[string]float64, error) {
	u := p.base + "/api/v1/query?" + url.Values{
		"query": {q},
		"time":  {strconv.FormatFloat(float64(at.UnixNano())/1e9, 'f', 3, 64)},
	}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	var ans struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		return nil, fmt.Errorf("query %s: %s: %w", q, strings.TrimSpace(string(body)), err)
	}
	if ans.Status != "success" || ans.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: status %s, type %s: %s", q, ans.Status, ans.Data.ResultType, ans.Error)
	}
	out := map[string]float64{}
	for _, r := range ans.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v: %w", q, r.Value, err)
		}
		out[r.Metric["direction"]] = v
	}
	return out, nil
}

// samples runs a range-vector selector as an instant query and returns the
// raw sample values of its one series, oldest first.
func (p *prometheus) samples(ctx context.Context, c *http.Client, selector string) ([]float64, error) {
	u := p.base + "/api/v1/query?" + url.Values{"query": {selector}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", selector, err)
	}
	defer resp.Body.Close()
	var ans struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Values [][2]any `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&ans); err != nil {
		return nil, fmt.Errorf("query %s: %w", selector, err)
	}
	if ans.Status != "success" || ans.Data.ResultType != "matrix" || len(ans.Data.Result) != 1 {
		return nil, fmt.Errorf("query %s: status %s, type %s, %d series: %s", selector, ans.Status, ans.Data.ResultType, len(ans.Data.Result), ans.Error)
	}
	var out []float64
	for _, sv := range ans.Data.Result[0].Values {
		s, _ := sv[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v: %w", selector, sv, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// freePort picks a free TCP port on 127.0.0.1 inside ns. The namespace is
// the test's own, so nothing else can take the port before it is used.
func freePort(t *testing.T, ns *qemu.NetNS) int {
	t.Helper()
	var port int
	if err := ns.Do(func() error {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		port = ln.Addr().(*net.TCPAddr).Port
		return ln.Close()
	}); err != nil {
		t.Fatalf("free port: %v", err)
	}
	return port
}

// fetch GETs u and returns the body, failing t on any error.
func fetch(t *testing.T, c *http.Client, u string) []byte {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", u, resp.Status, err)
	}
	return b
}

package metrics

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"vunet/test/testenv"
)

// TestPromtoolCheckMetrics lints a scrape with Prometheus' own promtool,
// every family present (sparse ones made non-zero).
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool := testenv.NeedTool(t, "promtool", "", "apt-get install prometheus")
	for name, src := range map[string]Sources{"every family": everySeries(), "idle": func() Sources { s, _, _, _ := testSources(8); return s }()} {
		text := scrape(t, src)
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(text)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil || out.Len() != 0 {
			t.Errorf("%s: promtool check metrics: %v\n%s", name, err, out.String())
		}
	}
}

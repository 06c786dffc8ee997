package qemu

import (
	"strings"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	in := `# HELP vunet_queue_frames_total Ethernet frames.
# TYPE vunet_queue_frames_total counter
vunet_queue_frames_total{direction="from_guest",queue="0"} 16
vunet_queue_frames_total{queue="1",direction="from_guest"} 4
vunet_queue_frames_total{direction="to_guest",queue="0"} 1.5e+01
vunet_queue_drops_total{direction="from_guest",queue="0",reason="a \"quoted\", reason"} 3
vunet_vhost_user_frontend_connected 1
`
	m, err := ParseMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := m.Get("vunet_queue_frames_total", "queue", "1", "direction", "from_guest"); !ok || v != 4 {
		t.Errorf("queue 1 tx = %v, %v", v, ok)
	}
	if v := m.Sum("vunet_queue_frames_total", "direction", "from_guest"); v != 20 {
		t.Errorf("tx sum = %v, want 20", v)
	}
	if v := m.Sum("vunet_queue_frames_total"); v != 35 {
		t.Errorf("all = %v, want 35", v)
	}
	if v, _ := m.Get("vunet_queue_drops_total", "direction", "from_guest", "queue", "0", "reason", `a "quoted", reason`); v != 3 {
		t.Errorf("quoted label value: %v (series %v)", v, m)
	}
	if v, _ := m.Get("vunet_vhost_user_frontend_connected"); v != 1 {
		t.Errorf("unlabelled gauge = %v", v)
	}
	for _, bad := range []string{"x{a=1} 2", `x{a="1" 2`, "x{a=\"1\"} nan-ish", "novalue"} {
		if _, err := ParseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseMetrics(%q) accepted", bad)
		}
	}
}

// TestMetricsNonZero: a failure's dump lists what the daemon counted,
// sorted, and leaves out zeros and the runtime's own series.
func TestMetricsNonZero(t *testing.T) {
	m := Metrics{
		`vunet_queue_kicks_total{queue="1"}`:      7,
		`vunet_queue_kicks_total{queue="0"}`:      0,
		`vunet_dhcp_leases_total{service="dhcp"}`: 1,
		`go_goroutines`:                              12,
		`process_open_fds`:                           9,
		`promhttp_metric_handler_requests_total`:     2,
		`vunet_queue_notifications_total{queue="0"}`: 2.5e6,
	}
	want := `vunet_dhcp_leases_total{service="dhcp"} 1` + "\n" +
		`vunet_queue_kicks_total{queue="1"} 7` + "\n" +
		`vunet_queue_notifications_total{queue="0"} 2500000`
	if got := m.NonZero(); got != want {
		t.Errorf("NonZero:\n%s\nwant:\n%s", got, want)
	}
}

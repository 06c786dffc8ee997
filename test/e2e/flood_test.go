package e2e

import (
	"strconv"
	"testing"
	"time"

	"vunet/test/guest"
)

// TestQEMUGuestARPFlood sends thousands of ARP requests (a different target
// each, a bounded window in flight) so both 256-entry rings wrap many times
// and notifications are suppressed and re-enabled over and over; every
// request must get exactly one answer, and vunet's counters must agree.
func TestQEMUGuestARPFlood(t *testing.T) {
	NeedQEMU(t)
	const n = 5000
	d := StartDaemon(t, DaemonConfig{Metrics: true})
	vm := StartVM(t, VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckARPFlood},
		Params: map[string]string{
			guest.ParamAddr:     "10.0.2.15/24",
			guest.ParamARPFlood: strconv.Itoa(n),
			guest.ParamTimeout:  "60s",
		},
		Timeout: 3 * time.Minute,
	})
	r := vm.RequireResult(t, guest.CheckARPFlood, 120*time.Second)
	t.Logf("guest: %s replies/s (TCG guest)", r.Fields["pps"])
	vm.Finish(t)
	if d.Passt {
		return
	}
	m, err := d.WaitMetric(5*time.Second, "flood counted", func(m Metrics) bool {
		return m.Sum("vunet_service_replies_total", "service", "arp") >= n
	})
	if err != nil {
		t.Error(err)
	}
	if m == nil {
		return
	}
	replies := m.Sum("vunet_service_replies_total", "service", "arp")
	arps := m.Sum("vunet_queue_tx_frames_by_ethertype_total", "ethertype", "arp")
	rx := m.Sum("vunet_queue_frames_total", "direction", "rx")
	t.Logf("vunet: %v ARP requests, %v replies, %v RX frames; notifications %v sent, %v suppressed; %v kicks",
		arps, replies, rx, m.Sum("vunet_queue_notifications_total"), m.Sum("vunet_queue_notifications_suppressed_total"),
		m.Sum("vunet_queue_kicks_total"))
	if arps != n || replies != n || rx != n {
		t.Errorf("vunet counted %v ARP requests, %v replies, %v RX frames; want %d each", arps, replies, rx, n)
	}
	// TX drops are expected (the link check's probes, the guest's IPv6
	// chatter); an RX drop would be a lost ARP answer.
	if bad := m.Sum("vunet_queue_drops_total", "direction", "rx") + m.Sum("vunet_queue_bad_chains_total"); bad != 0 {
		t.Errorf("%v RX drops or bad chains during the flood", bad)
	}
}

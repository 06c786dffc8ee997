package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// TestQEMUGuestARPFlood sends thousands of ARP requests (a different target
// each, a bounded window in flight) so both 256-entry rings wrap many times
// and notifications are suppressed and re-enabled over and over; every
// request must get exactly one answer, and vunet's counters must agree.
func TestQEMUGuestARPFlood(t *testing.T) {
	qemu.NeedQEMU(t)
	const n = 5000
	d := qemu.StartDaemon(t, qemu.DaemonConfig{Metrics: true})
	vm := qemu.StartVM(t, qemu.VMConfig{
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
	m, err := d.WaitMetric(5*time.Second, "flood counted", func(m qemu.Metrics) bool {
		return m.Sum("vunet_service_replies_total", "service", "arp") >= n
	})
	if err != nil {
		t.Error(err)
	}
	if m == nil {
		return
	}
	replies := m.Sum("vunet_service_replies_total", "service", "arp")
	arps := m.Sum("vunet_queue_classified_frames_total", "ethertype", "arp")
	rx := m.Sum("vunet_queue_frames_total", "direction", "to_guest")
	ndp := m.Sum("vunet_service_replies_total", "service", "ndp")
	disabled := m.Sum("vunet_queue_drops_total", "direction", "to_guest", "reason", "ring_disabled")
	// Every start of the queue pair announces the link: one gratuitous ARP
	// (counted as an ARP service reply) and one router advertisement. QEMU
	// starts the pair twice in a row at DRIVER_OK; the first start may be
	// stopped before it announces, or after, and then what it queued is
	// dropped with it (ring_disabled).
	starts := float64(len(d.Log.Match(func(l qemu.LogLine) bool { return l.Msg == "queue pair started" })))
	t.Logf("vunet: %v ARP requests, %v ARP replies, %v NDP frames, %v RX frames, %v pair starts, %v announcements dropped with a stopped pair; notifications %v sent, %v suppressed; %v kicks",
		arps, replies, ndp, rx, starts, disabled, m.Sum("vunet_queue_notifications_total"), m.Sum("vunet_queue_notifications_suppressed_total"),
		m.Sum("vunet_queue_kicks_total"))
	if arps != n || replies < n+1 || replies > n+starts || rx != replies+ndp-disabled {
		t.Errorf("vunet counted %v ARP requests, %v ARP replies, %v RX frames; want %d requests, %d plus 1..%v replies (a gratuitous ARP per pair start that got to run) and RX frames = ARP + NDP replies - dropped announcements (%v)",
			arps, replies, rx, n, n, starts, replies+ndp-disabled)
	}
	// TX drops are expected (the link check's probes, the guest's IPv6
	// chatter); any other RX drop would be a lost ARP answer.
	if bad := m.Sum("vunet_queue_drops_total", "direction", "to_guest") - disabled + m.Sum("vunet_queue_bad_chains_total"); bad != 0 || disabled > 2*(starts-1) {
		t.Errorf("%v RX drops or bad chains during the flood, %v announcements dropped for %v pair starts", bad, disabled, starts)
		for k, v := range m {
			if v != 0 && (strings.Contains(k, "drops_total") || strings.Contains(k, "service_replies")) {
				t.Logf("%s = %v", k, v)
			}
		}
	}
}

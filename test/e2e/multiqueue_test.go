package e2e

import (
	"strconv"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// virtioNetFMQ is VIRTIO_NET_F_MQ, which a back-end offering several queue
// pairs must offer for the guest to use more than one.
const virtioNetFMQ = 22

// TestQEMUGuestMultiQueue offers two queue pairs to a two-vCPU guest, which
// enables both: QEMU then repeats features, protocol features and every
// memory region per pair (FIELD-NOTES.md), and vunet must run both pairs
// and still carry the guest's traffic.
func TestQEMUGuestMultiQueue(t *testing.T) {
	qemu.NeedQEMU(t)
	const pairs = 2
	d := qemu.StartDaemon(t, qemu.DaemonConfig{Args: []string{"--queues", strconv.Itoa(pairs)}, Metrics: true})
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Queues: pairs,
		CPUs:   pairs,
		Checks: []string{guest.CheckLink, guest.CheckARP},
		Params: map[string]string{
			guest.ParamAddr:    "10.0.2.15/24",
			guest.ParamARP:     "10.0.2.2",
			guest.ParamTimeout: "30s",
			guest.ParamHold:    "3s",
		},
		Timeout: 3 * time.Minute,
	})
	link := vm.RequireResult(t, guest.CheckLink, 90*time.Second)
	if f := link.Fields["features"]; len(f) <= virtioNetFMQ || f[virtioNetFMQ] != '1' {
		t.Errorf("guest features %q: VIRTIO_NET_F_MQ (bit %d) not negotiated with --queues %d; the guest uses one pair", f, virtioNetFMQ, pairs)
	}
	vm.RequireResult(t, guest.CheckARP, 30*time.Second)
	vm.RequireResult(t, guest.ResultDone, 30*time.Second)
	if d.Passt {
		return
	}
	started := map[string]bool{}
	for _, l := range d.Log.Match(func(l qemu.LogLine) bool { return l.Msg == "queue pair started" }) {
		started[l.Attr("pair")] = true
	}
	for p := 0; p < pairs; p++ {
		if !started[strconv.Itoa(p)] {
			t.Errorf("queue pair %d never started (started: %v)", p, started)
		}
	}
	m, err := d.WaitMetric(5*time.Second, "ARP reply counted", func(m qemu.Metrics) bool {
		return m.Sum("vunet_service_replies_total", "service", "arp") >= 1
	})
	if err != nil {
		t.Error(err)
	}
	if m != nil {
		if bad := m.Sum("vunet_vhost_user_errors_total"); bad != 0 {
			t.Errorf("vhost-user errors with %d queue pairs: %v", pairs, bad)
		}
		for p := 0; p < pairs; p++ {
			t.Logf("pair %d: tx %v rx %v frames", p,
				m.Sum("vunet_queue_frames_total", "queue", strconv.Itoa(p), "direction", "from_guest"),
				m.Sum("vunet_queue_frames_total", "queue", strconv.Itoa(p), "direction", "to_guest"))
		}
	}
	if err := vm.WaitExit(20 * time.Second); err != nil {
		t.Errorf("QEMU after power-off: %v", err)
	}
}

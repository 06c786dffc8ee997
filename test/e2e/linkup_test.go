package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// virtioFVersion1 is VIRTIO_F_VERSION_1; the guest's features file is a
// string of '0'/'1' indexed by bit number.
const virtioFVersion1 = 32

// TestQEMUGuestLinkUp boots a guest on vunet and checks the first
// milestone: the vhost-user handshake completes with QEMU, the guest's eth0
// comes up, frames it transmits are taken off the TX ring and completed (the
// guest driver counts tx_packets only on completion), vunet sees them, and
// an ARP request is answered through the RX ring.
func TestQEMUGuestLinkUp(t *testing.T) {
	qemu.NeedQEMU(t)
	start := time.Now()
	d := qemu.StartDaemon(t, qemu.DaemonConfig{Args: []string{"--one-off"}, Metrics: true})
	const txFrames = 16
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckARP},
		Params: map[string]string{
			// Static address: ARP probes from 0.0.0.0 are not answered.
			guest.ParamAddr:     "10.0.2.15/24",
			guest.ParamARP:      "10.0.2.2",
			guest.ParamTXFrames: strconv.Itoa(txFrames),
			guest.ParamTimeout:  "20s",
			// Time to scrape vunet's metrics before QEMU, and with
			// --one-off vunet, exit.
			guest.ParamHold: "3s",
		},
		Timeout: 90 * time.Second,
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rf, err := vm.QMP.QueryRxFilter(ctx, qemu.NICID)
	if err != nil {
		t.Fatalf("query-rx-filter: %v", err)
	}
	if rf.Name != qemu.NICID || !strings.EqualFold(rf.MainMAC, vm.MAC) {
		t.Errorf("query-rx-filter = %+v, want NIC %s with MAC %s", rf, qemu.NICID, vm.MAC)
	}

	boot := vm.RequireResult(t, guest.ResultBoot, 60*time.Second)
	link := vm.RequireResult(t, guest.CheckLink, 40*time.Second)
	if !strings.EqualFold(link.Fields["mac"], vm.MAC) {
		t.Errorf("guest eth0 MAC %q, want %s", link.Fields["mac"], vm.MAC)
	}
	if sent, _ := strconv.Atoi(link.Fields["sent"]); sent != txFrames {
		t.Errorf("guest sent %d probe frames, want %d", sent, txFrames)
	}
	if tx, _ := strconv.Atoi(link.Fields["tx_packets"]); tx < txFrames {
		t.Errorf("guest tx_packets = %d, want >= %d completed by the back-end", tx, txFrames)
	}
	if f := link.Fields["features"]; len(f) <= virtioFVersion1 || f[virtioFVersion1] != '1' {
		t.Errorf("guest features %q: VIRTIO_F_VERSION_1 not negotiated", f)
	}
	arp := vm.RequireResult(t, guest.CheckARP, 30*time.Second)
	if arp.Fields["mac"] == "" || strings.EqualFold(arp.Fields["mac"], vm.MAC) {
		t.Errorf("ARP reply from %q: want the back-end's MAC", arp.Fields["mac"])
	}
	if rx, _ := strconv.Atoi(arp.Fields["rx_packets"]); arp.Fields["rx_packets"] != "" && rx < 1 {
		t.Errorf("guest rx_packets = %d after an ARP reply", rx)
	}

	done := vm.RequireResult(t, guest.ResultDone, 30*time.Second)
	if !d.Passt {
		checkLinkMetrics(t, d, txFrames)
	}
	if err := vm.WaitExit(20 * time.Second); err != nil {
		t.Fatalf("QEMU after power-off: %v", err)
	}
	t.Logf("guest: boot at %ss uptime, done at %ss; test took %v",
		boot.Fields["uptime"], done.Fields["uptime"], time.Since(start).Round(time.Millisecond))

	if d.Passt {
		t.Log("passt stand-in: vunet log assertions skipped")
		return
	}
	for _, msg := range []string{"vhost-user front-end connected", "vhost-user features negotiated", "queue pair started"} {
		if _, err := d.Log.Wait(5*time.Second, strconv.Quote(msg), qemu.MsgIs(msg)); err != nil {
			t.Error(err)
		}
	}
	// QEMU 7.2 maps memory with ADD_MEM_REG (CONFIGURE_MEM_SLOTS), other
	// front-ends with SET_MEM_TABLE; both end in per-region debug lines.
	regions := d.Log.Match(func(l qemu.LogLine) bool { return l.Msg == "guest memory region" && l.Attr("size") != "0" })
	if len(regions) == 0 {
		t.Error("no guest memory region mapped according to the daemon log")
	}
	// vunet logs dropped frames at debug level, rate-limited to one line a
	// second per queue pair: the line may show the guest's IPv6 chatter
	// (sent as eth0 comes up, with the probes) instead of a probe, so any
	// drop line from the guest's MAC will do; the metrics above counted the
	// probes exactly.
	drops := d.Log.Match(func(l qemu.LogLine) bool {
		return l.Msg == "frame dropped" && strings.EqualFold(l.Attr("src"), vm.MAC)
	})
	if len(drops) == 0 {
		t.Errorf("no %q line from %s in the daemon log", "frame dropped", vm.MAC)
	}
	// --one-off: the daemon leaves when QEMU does, cleanly.
	if err := d.WaitExit(10 * time.Second); err != nil {
		t.Errorf("daemon with --one-off after QEMU exit: %v", err)
	}
}

// checkLinkMetrics asserts vunet counted what the guest did: the probe
// frames by ethertype and as drops, the ARP request and its reply, and no
// protocol or ring errors.
func checkLinkMetrics(t *testing.T, d *qemu.Daemon, txFrames int) {
	t.Helper()
	want := float64(txFrames)
	m, err := d.WaitMetric(5*time.Second, "probe frames and ARP reply counted", func(m qemu.Metrics) bool {
		return m.Sum("vunet_queue_classified_frames_total", "ethertype", "other") >= want &&
			m.Sum("vunet_service_replies_total", "service", "arp") >= 1 &&
			m.Sum("vunet_queue_frames_total", "direction", "to_guest") >= 1
	})
	if err != nil {
		t.Error(err)
	}
	if m == nil {
		return
	}
	for _, c := range []struct {
		what string
		got  float64
		ok   bool
	}{
		// Exactly: nothing but the agent sends the experimental ethertype.
		{"tx frames of ethertype other (the probes)", m.Sum("vunet_queue_classified_frames_total", "ethertype", "other"), m.Sum("vunet_queue_classified_frames_total", "ethertype", "other") == want},
		{"tx drops for unknown ethertype", m.Sum("vunet_queue_drops_total", "direction", "from_guest", "reason", "unknown_ethertype"), m.Sum("vunet_queue_drops_total", "direction", "from_guest", "reason", "unknown_ethertype") >= want},
		{"tx frames of ethertype arp", m.Sum("vunet_queue_classified_frames_total", "ethertype", "arp"), m.Sum("vunet_queue_classified_frames_total", "ethertype", "arp") >= 1},
		{"tx frames", m.Sum("vunet_queue_frames_total", "direction", "from_guest"), m.Sum("vunet_queue_frames_total", "direction", "from_guest") >= want+1},
		{"ARP replies", m.Sum("vunet_service_replies_total", "service", "arp"), m.Sum("vunet_service_replies_total", "service", "arp") >= 1},
		{"rx frames", m.Sum("vunet_queue_frames_total", "direction", "to_guest"), m.Sum("vunet_queue_frames_total", "direction", "to_guest") >= 1},
		{"bad chains", m.Sum("vunet_queue_bad_chains_total"), m.Sum("vunet_queue_bad_chains_total") == 0},
		{"vhost-user errors", m.Sum("vunet_vhost_user_errors_total"), m.Sum("vunet_vhost_user_errors_total") == 0},
		{"front-end connected", m.Sum("vunet_vhost_user_frontend_connected"), m.Sum("vunet_vhost_user_frontend_connected") == 1},
	} {
		if !c.ok {
			t.Errorf("metric %s = %v", c.what, c.got)
		} else {
			t.Logf("metric %s = %v", c.what, c.got)
		}
	}
}

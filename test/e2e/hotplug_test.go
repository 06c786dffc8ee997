package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
)

// TestQEMUHotplugNIC boots a guest without a network card, hot-plugs a
// vhost-user NIC on vunet through QMP the way libvirt does, and checks the
// guest finds it, transmits through it and gets ARP answers. The agent's link
// check waits for eth0 to appear, so the plug can happen after boot.
func TestQEMUHotplugNIC(t *testing.T) {
	NeedQEMU(t)
	start := time.Now()
	d := StartDaemon(t, DaemonConfig{})
	vm := StartVM(t, VMConfig{
		NoNIC:  true,
		Checks: []string{guest.CheckLink, guest.CheckARP},
		Params: map[string]string{
			guest.ParamAddr:    "10.0.2.15/24",
			guest.ParamARP:     "10.0.2.2",
			guest.ParamTimeout: "40s",
		},
		Timeout: 2 * time.Minute,
	})
	vm.RequireResult(t, guest.ResultBoot, 60*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const mac = "52:54:00:ab:cd:01"
	if err := vm.HotplugVhostUser(ctx, d.Socket, "hp0", mac); err != nil {
		t.Fatalf("hot-plug: %v", err)
	}
	plugged := time.Since(start)
	rf, err := vm.QMP.QueryRxFilter(ctx, "hp0")
	if err != nil {
		t.Fatalf("query-rx-filter hp0: %v", err)
	}
	if !strings.EqualFold(rf.MainMAC, mac) {
		t.Errorf("hot-plugged NIC has MAC %s, want %s", rf.MainMAC, mac)
	}

	link := vm.RequireResult(t, guest.CheckLink, 60*time.Second)
	if !strings.EqualFold(link.Fields["mac"], mac) {
		t.Errorf("guest eth0 MAC %q, want the hot-plugged %s", link.Fields["mac"], mac)
	}
	if tx, _ := strconv.Atoi(link.Fields["tx_packets"]); tx < guest.DefaultTXFrames {
		t.Errorf("guest tx_packets = %d, want >= %d", tx, guest.DefaultTXFrames)
	}
	vm.RequireResult(t, guest.CheckARP, 30*time.Second)
	vm.Finish(t)
	t.Logf("plugged %v after start, test took %v", plugged.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if !d.Passt {
		if _, err := d.Log.Wait(5*time.Second, "queue pair started", MsgIs("queue pair started")); err != nil {
			t.Error(err)
		}
	}
}

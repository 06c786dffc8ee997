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

// TestQEMUHotplugNIC boots a guest without a network card and, through
// QMP as libvirt does it, hot-plugs a vhost-user NIC on vunet, uses it
// (DHCP, a 20 MB download checked byte for byte), unplugs it, and plugs a
// second NIC into the same daemon, which must serve it like the first: the
// daemon stays healthy across a front-end device that comes and goes.
func TestQEMUHotplugNIC(t *testing.T) {
	qemu.NeedQEMU(t)
	start := time.Now()
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	d := netDaemon(t, ns)
	const size = 20 << 20
	vm := qemu.StartVM(t, qemu.VMConfig{
		NoNIC: true,
		Checks: []string{
			guest.CheckLink, guest.CheckDHCP, guest.XferCheck("hp0"), guest.CheckGone,
			guest.CheckLink + "#2", guest.CheckDHCP + "#2", guest.XferCheck("hp1"),
		},
		Params: map[string]string{
			guest.XferParam("hp0"): guest.XferSpec(guest.XferDown, srv.Target(guest.TargetGW4), size),
			guest.XferParam("hp1"): guest.XferSpec(guest.XferUp, srv.Target(guest.TargetGW4), size),
			guest.ParamTimeout:     "60s",
		},
		Timeout: 3 * time.Minute,
	})
	vm.RequireResult(t, guest.ResultBoot, 60*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	plug := func(id, mac, linkCheck string) {
		t.Helper()
		if err := vm.HotplugVhostUser(ctx, d.Socket, id, mac); err != nil {
			t.Fatalf("hot-plug %s: %v", id, err)
		}
		rf, err := vm.QMP.QueryRxFilter(ctx, id)
		if err != nil {
			t.Fatalf("query-rx-filter %s: %v", id, err)
		}
		if !strings.EqualFold(rf.MainMAC, mac) {
			t.Errorf("hot-plugged NIC %s has MAC %s, want %s", id, rf.MainMAC, mac)
		}
		link := vm.RequireResult(t, linkCheck, 60*time.Second)
		if !strings.EqualFold(link.Fields["mac"], mac) {
			t.Errorf("guest eth0 MAC %q, want the hot-plugged %s", link.Fields["mac"], mac)
		}
		if tx, _ := strconv.Atoi(link.Fields["tx_packets"]); tx < guest.DefaultTXFrames {
			t.Errorf("guest tx_packets = %d, want >= %d", tx, guest.DefaultTXFrames)
		}
	}

	plug("hp0", "52:54:00:ab:cd:01", guest.CheckLink)
	t.Logf("first NIC plugged %v after start", time.Since(start).Round(time.Millisecond))
	vm.RequireResult(t, guest.CheckDHCP, 30*time.Second)
	srv.CheckXfer(t, vm.RequireResult(t, guest.XferCheck("hp0"), 60*time.Second), guest.XferDown, size)

	if err := vm.UnplugVhostUser(ctx, "hp0"); err != nil {
		t.Fatalf("unplug hp0: %v", err)
	}
	vm.RequireResult(t, guest.CheckGone, 30*time.Second)
	if st, err := vm.QMP.QueryStatus(ctx); err != nil || !st.Running {
		t.Errorf("query-status after unplug: %+v, %v", st, err)
	}
	if !d.Passt {
		if _, err := d.Log.Wait(10*time.Second, "front-end gone after unplug", qemu.MsgIs("vhost-user front-end disconnected")); err != nil {
			t.Error(err)
		}
		if _, err := d.WaitMetric(10*time.Second, "no front-end connected", func(m qemu.Metrics) bool {
			return m.Sum("vunet_vhost_user_frontend_connected") == 0
		}); err != nil {
			t.Error(err)
		}
	}
	select {
	case <-d.Exited():
		t.Fatalf("daemon exited after the unplug: %v", d.ExitErr())
	default:
	}

	plug("hp1", "52:54:00:ab:cd:02", guest.CheckLink+"#2")
	vm.RequireResult(t, guest.CheckDHCP+"#2", 30*time.Second)
	srv.CheckXfer(t, vm.RequireResult(t, guest.XferCheck("hp1"), 60*time.Second), guest.XferUp, size)
	vm.Finish(t)
	checkNoRingErrors(t, d)
	t.Logf("test took %v", time.Since(start).Round(time.Millisecond))
}

package e2e

import (
	"strconv"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// streamXfer is the size of each transfer over the stream transport:
// QEMU's own virtio-net moves the frames (no vhost), so TCG is slower.
const streamXfer = 32 << 20

// streamNetdev is the -netdev that dials vunet's stream transport on
// path, as `vunet qemu-args --transport stream` prints it for QEMU 7.2.
func streamNetdev(path string) string {
	return "stream,id=n0,server=off,addr.type=unix,addr.path=" + path
}

// TestQEMUStreamTransport boots a QEMU 7.2 guest on vunet's stream
// transport (-netdev stream, what passt serves without --vhost-user): the
// guest gets its lease, downloads and uploads 32 MB byte-exact through
// the gateway, and 20 datagrams of 1 to 65000 bytes (a 65000-byte one
// is a frame of 65042 bytes on the stream) come back from a UDP echo.
// The daemon counts one stream session, no frame length out of bounds
// and no write error; it is still serving when the guest has gone.
func TestQEMUStreamTransport(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	d := netDaemon(t, ns, "--transport", "stream")
	params := map[string]string{
		guest.ParamTimeout:       xferCheckTimeout,
		guest.ParamUDPEcho:       srv.Target(guest.TargetGW4),
		guest.XferParam("down4"): guest.XferSpec(guest.XferDown, srv.Target(guest.TargetGW4), streamXfer),
		guest.XferParam("up4"):   guest.XferSpec(guest.XferUp, srv.Target(guest.TargetGW4), streamXfer),
	}
	vm := qemu.StartVM(t, qemu.VMConfig{
		Netdev: streamNetdev(d.Socket),
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.XferCheck("down4"), guest.XferCheck("up4"), guest.CheckUDPEcho},
		Params: params, Timeout: 5 * time.Minute,
	})
	checkLease(t, vm.RequireResult(t, guest.CheckDHCP, 60*time.Second), lease{
		addr: addrOf(ns.Host.Addr), prefix: ns.Host.Prefix, router: addrOf(ns.Host.Gateway), dns: ns.DNS4,
		mtu: defaultGuestMTU, search: "e2e.test",
	})
	srv.CheckXfer(t, vm.RequireResult(t, guest.XferCheck("down4"), 150*time.Second), guest.XferDown, streamXfer)
	srv.CheckXfer(t, vm.RequireResult(t, guest.XferCheck("up4"), 150*time.Second), guest.XferUp, streamXfer)
	r := vm.RequireResult(t, guest.CheckUDPEcho, 60*time.Second)
	if r.Fields["echoed"] != strconv.Itoa(len(guest.UDPEchoSizes)) || r.Fields["mismatched"] != "0" {
		t.Errorf("udp echo: %s", r.Format())
	}
	vm.Finish(t)

	m, err := d.WaitMetric(10*time.Second, "the session's end", func(m qemu.Metrics) bool {
		return m.Sum("vunet_stream_sessions_total") == 1 && m.Sum("vunet_flows_closed_total") > 0
	})
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	for _, name := range []string{"vunet_stream_closes_total", "vunet_queue_bad_chains_total", "vunet_vhost_user_errors_total"} {
		if v := m.Sum(name); v != 0 {
			t.Errorf("%s = %v", name, v)
		}
	}
	t.Logf("stream: %v bytes read, %v written, %v writes waited for the socket",
		m.Sum("vunet_stream_bytes_total", "direction", "from_guest"), m.Sum("vunet_stream_bytes_total", "direction", "to_guest"),
		m.Sum("vunet_stream_write_waits_total"))
	select {
	case <-d.Exited():
		t.Fatal("the daemon left with its guest (it serves the next one unless --one-off)")
	default:
	}
}

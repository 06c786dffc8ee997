package e2e

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"vunet/test/callers"
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

// TestQEMUDropInQEMUNetdevPasstStream plays QEMU 10.1's -netdev passt
// without vhost-user=on: QEMU's socket pair, passt's command line as
// net_passt_decode_args builds it (no --vhost-user: the stream protocol
// on --fd 3), the exit awaited and the pid file read; then QEMU 7.2 gets
// the other end of the pair as -netdev stream,addr.type=fd, which is what
// QEMU 10.1 itself does with it. The guest must get the lease the
// properties say and download byte-exact.
func TestQEMUDropInQEMUNetdevPasstStream(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	h := ns.Host
	dir := qemu.WorkDir(t)
	pidFile := qemuPasstPIDFile(t, dir)
	logFile := filepath.Join(dir, "passt.log")
	want := lease{addr: netip.MustParseAddr("10.7.0.89"), prefix: 24, router: addrOf(h.Gateway),
		dns: netip.MustParseAddr("10.7.0.99"), mtu: 4000, search: "stream.e2e.test"}
	argv := callers.QEMU101(callers.QEMUPasst{
		MTU: want.mtu, Address: want.addr.String(), Netmask: "255.255.255.0", Gateway: want.router.String(),
		Interface: h.Iface, DNS: want.dns.String(), Search: []string{want.search},
		Param: []string{"--debug", "--log-file", logFile}, // param=: after --quiet, so it wins
	}, pidFile)

	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	qemuEnd, passtEnd := os.NewFile(uintptr(fds[0]), "qemu-end"), os.NewFile(uintptr(fds[1]), "passt-end")
	defer qemuEnd.Close()
	callerLaunch(t, ns, argv, []*os.File{passtEnd}, dir)
	passtEnd.Close() // QEMU: close(sv[1]) once passt has it
	checkDaemonPID(t, pidFile, dir)
	checkLog(t, logFile, `msg="vunet starting"`, "transport=stream", "mode=fd", `msg="stream front-end connected"`)

	vm := qemu.StartVM(t, dropInVM(srv, qemu.VMConfig{
		Netdev:     "stream,id=n0,addr.type=fd,addr.str=3",
		ExtraFiles: []*os.File{qemuEnd},
	}))
	qemuEnd.Close() // QEMU has its own copy
	checkDropInGuest(t, srv, vm, want)
	vm.Finish(t)
}

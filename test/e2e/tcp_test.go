package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// TestQEMUGuestHTTPDownload has the guest download a random blob from an
// HTTP server on the host's loopback through the gateway address (vunet maps
// connections to the gateway to the host's loopback by default, DESIGN.md),
// and checks every byte arrived: size and SHA-256 must match what was served.
// Under TCG the guest is the bottleneck; the rate is logged, not asserted.
func TestQEMUGuestHTTPDownload(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	host := ns.Host
	const size = 32 << 20
	blob := make([]byte, size)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(blob)
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		_, _ = w.Write(blob)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	d := netDaemon(t, ns)
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckHTTP},
		Params: map[string]string{
			guest.ParamHTTP:    fmt.Sprintf("http://%s:%d/blob", host.Gateway, port),
			guest.ParamTimeout: "90s",
		},
		Timeout: 3 * time.Minute,
	})
	r := vm.RequireResult(t, guest.CheckHTTP, 150*time.Second)
	if r.Fields["bytes"] != strconv.Itoa(size) || r.Fields["sha256"] != hex.EncodeToString(sum[:]) {
		t.Errorf("guest got %s bytes with sha256 %s, want %d bytes with %x", r.Fields["bytes"], r.Fields["sha256"], size, sum)
	}
	t.Logf("guest download: %s Mbit/s (TCG guest; not a back-end benchmark)", r.Fields["mbps"])
	vm.Finish(t)
}

// TestQEMUGuestPing pings the gateway from the guest; vunet answers it
// through a host ICMP (ping) socket towards the host's loopback. The
// daemon runs in a private namespace whose net.ipv4.ping_group_range
// allows ping sockets (NewNetNS): the host's own setting is not touched.
func TestQEMUGuestPing(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	d := netDaemon(t, ns)
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckPing},
	})
	r := vm.RequireResult(t, guest.CheckPing, 90*time.Second)
	if r.Fields["target"] != ns.Host.Gateway.String() || r.Fields["received"] != r.Fields["sent"] || r.Fields["sent"] == "" {
		t.Errorf("ping %s: %s of %s answered, want every echo to the gateway %s answered", r.Fields["target"], r.Fields["received"], r.Fields["sent"], ns.Host.Gateway)
	}
	vm.Finish(t)
	if !d.Passt {
		// The echoes went through a host socket (a flow), not a reply
		// made up by the daemon.
		if _, err := d.WaitMetric(5*time.Second, "an ICMP echo flow opened", func(m qemu.Metrics) bool {
			return m.Sum("vunet_flows_opened_total", "protocol", "icmp") >= 1
		}); err != nil {
			t.Error(err)
		}
	}
}

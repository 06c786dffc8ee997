package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// xferSize is each bulk transfer's size. A TCG guest moves about 100–200
// Mbit/s while it also hashes, so one transfer takes 5–10 s; timeouts are
// set for ten times that.
const xferSize = 100 << 20

// xferCheckTimeout is the agent's per-check timeout in the transfer tests.
const xferCheckTimeout = "120s"

// netDaemon starts vunet in ns with metrics and the given flags.
func netDaemon(t *testing.T, ns *qemu.NetNS, args ...string) *qemu.Daemon {
	t.Helper()
	return qemu.StartDaemon(t, qemu.DaemonConfig{NetNS: ns, Metrics: true, Args: args})
}

// xferParams adds transfers to a VM's parameters and returns the checks
// that run them, in order.
func xferParams(params map[string]string, srv *qemu.TrafficServer, xfers ...[2]string) []string {
	var checks []string
	for _, x := range xfers { // {label, dir@host}
		dir, host, _ := strings.Cut(x[1], "@")
		params[guest.XferParam(x[0])] = guest.XferSpec(dir, srv.Target(host), xferSize)
		checks = append(checks, guest.XferCheck(x[0]))
	}
	return checks
}

// TestQEMUGuestTCPTransfer downloads and uploads 100 MB each between the
// guest and a server on the host's loopback, reached through the IPv4
// gateway address, and compares SHA-256 digests taken on both ends.
func TestQEMUGuestTCPTransfer(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	d := netDaemon(t, ns)
	params := map[string]string{guest.ParamTimeout: xferCheckTimeout}
	checks := append([]string{guest.CheckLink, guest.CheckDHCP},
		xferParams(params, srv, [2]string{"down4", guest.XferDown + "@" + guest.TargetGW4}, [2]string{"up4", guest.XferUp + "@" + guest.TargetGW4})...)
	vm := qemu.StartVM(t, qemu.VMConfig{Socket: d.Socket, Checks: checks, Params: params, Timeout: 5 * time.Minute})
	vm.RequireResult(t, guest.CheckDHCP, 60*time.Second)
	// Started by root with no sandbox flags, the daemon moves the data
	// confined: nobody, no capability, no_new_privs, seccomp.
	checkConfinedDuringDownload(t, d, srv, confinedNobody)
	srv.CheckXfer(t, vm.RequireResult(t, guest.XferCheck("down4"), 150*time.Second), guest.XferDown, xferSize)
	srv.CheckXfer(t, vm.RequireResult(t, guest.XferCheck("up4"), 150*time.Second), guest.XferUp, xferSize)
	vm.Finish(t)
	checkNoRingErrors(t, d)
}

// checkNoRingErrors asserts the daemon counted no bad descriptor chains and
// no vhost-user protocol errors.
func checkNoRingErrors(t *testing.T, d *qemu.Daemon) {
	t.Helper()
	if d.Passt || d.MetricsAddr == "" {
		return
	}
	m, err := d.WaitMetric(5*time.Second, "scrape", func(qemu.Metrics) bool { return true })
	if err != nil {
		t.Errorf("metrics: %v", err)
		return
	}
	if v := m.Sum("vunet_queue_bad_chains_total"); v != 0 {
		t.Errorf("vunet_queue_bad_chains_total = %v", v)
	}
	if v := m.Sum("vunet_vhost_user_errors_total"); v != 0 {
		var by []string
		for k, n := range m {
			if strings.HasPrefix(k, "vunet_vhost_user_errors_total{") && n != 0 {
				by = append(by, fmt.Sprintf("%s = %v", k, n))
			}
		}
		t.Errorf("vunet_vhost_user_errors_total = %v: %s", v, strings.Join(by, ", "))
	}
}

// TestQEMUGuestUDPEcho sends datagrams of 20 sizes, from 1 byte to 65000,
// to a UDP echo on the host's loopback through the gateway address; every
// one must come back byte for byte.
func TestQEMUGuestUDPEcho(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	d := netDaemon(t, ns)
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckUDPEcho},
		Params: map[string]string{guest.ParamUDPEcho: srv.Target(guest.TargetGW4)},
	})
	r := vm.RequireResult(t, guest.CheckUDPEcho, 60*time.Second)
	if r.Fields["echoed"] != strconv.Itoa(len(guest.UDPEchoSizes)) || r.Fields["mismatched"] != "0" {
		t.Errorf("udp echo: %s", r.Format())
	}
	if r.Fields["retries"] != "0" {
		t.Logf("udp echo needed %s retransmissions (%s)", r.Fields["retries"], r.Fields["detail"])
	}
	if got := srv.UDPEchoed(); got < len(guest.UDPEchoSizes) {
		t.Errorf("server echoed %d datagrams, want >= %d", got, len(guest.UDPEchoSizes))
	}
	vm.Finish(t)
}

// manyConns is how many TCP connections the guest holds open at once.
const manyConns = 500

// TestQEMUGuestTCPConnections opens 500 TCP connections from the guest to
// the host at the same time, then echoes one byte on each: the daemon must
// hold 500 host sockets and their guest-side state at once.
func TestQEMUGuestTCPConnections(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	d := netDaemon(t, ns)
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckTCPMany},
		Params: map[string]string{
			guest.ParamTCPMany: srv.Target(guest.TargetGW4) + "," + strconv.Itoa(manyConns),
			guest.ParamTimeout: "90s",
		},
		Timeout: 3 * time.Minute,
	})
	r := vm.RequireResult(t, guest.CheckTCPMany, 120*time.Second)
	if r.Fields["echoed"] != strconv.Itoa(manyConns) {
		t.Errorf("tcpmany: %s", r.Format())
	}
	accepted, maxOpen := srv.EchoConns()
	if len(accepted) != manyConns || maxOpen != manyConns {
		t.Errorf("server accepted %d echo connections, at most %d open at once; want %d and %d", len(accepted), maxOpen, manyConns, manyConns)
	}
	t.Logf("%d connections established in %s ms, all open at once on the host: %d", manyConns, r.Fields["dial_ms"], maxOpen)
	vm.Finish(t)
	checkNoRingErrors(t, d)
}

// TestQEMUGuestInboundForward forwards a host port to a guest listener
// with -t HOST:GUEST and sends 20 MB through it from the host's side;
// the guest's digest must equal the sender's.
func TestQEMUGuestInboundForward(t *testing.T) {
	qemu.NeedQEMU(t)
	needFlag(t, "--tcp-ports")
	ns := qemu.NewNetNS(t)
	const hostPort, guestPort, size = 18080, 8080, 20 << 20
	d := netDaemon(t, ns, "-t", fmt.Sprintf("%d:%d", hostPort, guestPort))
	vm := qemu.StartVM(t, qemu.VMConfig{
		Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckTCPServe},
		Params: map[string]string{guest.ParamTCPServe: strconv.Itoa(guestPort), guest.ParamTimeout: "60s"},
	})
	vm.RequireResult(t, guest.ResultTCPServeReady, 60*time.Second)

	blob := make([]byte, size)
	_, _ = rand.Read(blob)
	sum := sha256.Sum256(blob)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := ns.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", hostPort))
	if err != nil {
		t.Fatalf("dial the forwarded port: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	start := time.Now()
	if _, err := c.Write(blob); err != nil {
		t.Fatalf("send through the forward: %v", err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && err != io.EOF {
		t.Fatalf("guest's answer: %v", err)
	}
	want := fmt.Sprintf("%d %s\n", size, hex.EncodeToString(sum[:]))
	if answer != want {
		t.Errorf("guest answered %q, want %q", answer, want)
	}
	t.Logf("inbound %d bytes in %v", size, time.Since(start).Round(time.Millisecond))
	r := vm.RequireResult(t, guest.CheckTCPServe, 60*time.Second)
	if r.Fields["sha256"] != hex.EncodeToString(sum[:]) {
		t.Errorf("guest result %s, want sha256 %x", r.Format(), sum)
	}
	vm.Finish(t)
}

// needFlag fails the test when the daemon's --help does not list flag: a
// required feature is missing, which must not pass as a skip.
func needFlag(t *testing.T, flag string) {
	t.Helper()
	if qemu.HelpHas(t, flag) {
		return
	}
	t.Fatalf("vunet --help lists no %s: feature pending in cmd/vunet", flag)
}

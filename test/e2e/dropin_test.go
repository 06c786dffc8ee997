package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"vunet/test/callers"
	"vunet/test/guest"
	"vunet/test/qemu"
	"vunet/test/testenv"
)

// The drop-in tests start vunet exactly as libvirt and QEMU start passt
// (package callers rebuilds their command lines from their sources): the
// binary is reached as "passt" through PATH, the command must return 0
// once the daemon serves, the pid file must name the daemon, and then a
// QEMU 7.2 guest boots on what the command left behind. QEMU 7.2 has no
// -netdev passt, so the test plays QEMU 10.1's part in launching (--fd 3,
// wait for the exit, read the pid file). The connected socket it hands
// over cannot be one end of a socket pair as in QEMU 10.1: QEMU 7.2
// refuses a vhost-user chardev on an inherited descriptor ("does not
// support FD passing"). So QEMU 7.2 listens (server=on,wait=off) and the
// test's connection to it is descriptor 3: to vunet, the same thing, a
// connected UNIX stream socket with the front-end on the other end.

// dropInXfer is the size of each download: enough to cross many rings,
// short under TCG.
const dropInXfer = 4 << 20

// callerLaunch runs a caller's command line inside ns, with the vunet
// binary first in PATH as passt, and checks passt's start-up contract:
// exit 0, nothing left holding the output open. It registers a check
// that the daemon leaves by itself once its one front-end has gone
// (--one-off), which runs after the guest's cleanup.
func callerLaunch(t *testing.T, ns *qemu.NetNS, argv []string, extra []*os.File, marker string) callers.Result {
	t.Helper()
	ip := testenv.NeedTool(t, "ip", "", "apt-get install iproute2")
	dir := filepath.Join(qemu.WorkDir(t), "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := callers.PasstLink(dir, qemu.DaemonBinary(t)); err != nil {
		t.Fatal(err)
	}
	t.Logf("caller runs: %s", strings.Join(argv, " "))
	r, err := callers.Launch(ip, ns.Command(argv...), extra, []string{"PATH=" + dir + ":" + os.Getenv("PATH")}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checkDaemonLeft(t, marker) })
	if r.Code != 0 {
		t.Fatalf("passt (vunet) exited %d after %v; stderr:\n%s", r.Code, r.Took, r.Stderr)
	}
	t.Logf("the command returned 0 after %v; stderr:\n%s", r.Took.Round(time.Millisecond), r.Stderr)
	return r
}

// daemonsNaming lists the processes of the vunet binary whose command
// line contains marker (a path under this test's work directory): the
// daemons this test started, whatever became of the launcher.
func daemonsNaming(t *testing.T, marker string) []int {
	t.Helper()
	bin, _ := filepath.EvalSymlinks(qemu.DaemonBinary(t))
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || exe != bin {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if bytes.Contains(cmdline, []byte(marker)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// checkDaemonLeft fails the test if a daemon it started outlives its
// front-end by more than 3 s, and stops it.
func checkDaemonLeft(t *testing.T, marker string) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		pids := daemonsNaming(t, marker)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("daemon(s) %v still running 3 s after the guest left (--one-off)", pids)
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkDaemonPID checks the pid file names a running daemon of ours that
// is not the launcher.
func checkDaemonPID(t *testing.T, pidFile, marker string) int {
	t.Helper()
	pid, err := callers.ReadPID(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range daemonsNaming(t, marker) {
		found = found || p == pid
	}
	if !found {
		t.Fatalf("pid file %s names %d, not a running vunet daemon of this test", pidFile, pid)
	}
	return pid
}

// dropInVM adds to cfg the guest's checks: DHCP, then a download through
// the gateway, then extraChecks.
func dropInVM(srv *qemu.TrafficServer, cfg qemu.VMConfig, extraChecks ...string) qemu.VMConfig {
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params[guest.ParamTimeout] = "60s"
	cfg.Params[guest.XferParam("down")] = guest.XferSpec(guest.XferDown, srv.Target(guest.TargetGW4), dropInXfer)
	cfg.Checks = append([]string{guest.CheckLink, guest.CheckDHCP, guest.XferCheck("down")}, extraChecks...)
	cfg.Timeout = 3 * time.Minute
	return cfg
}

// checkDropInGuest checks the lease against want and the download
// byte for byte.
func checkDropInGuest(t *testing.T, srv *qemu.TrafficServer, vm *qemu.VM, want lease) {
	t.Helper()
	checkLease(t, vm.RequireResult(t, guest.CheckDHCP, 60*time.Second), want)
	srv.CheckXfer(t, vm.RequireResult(t, guest.XferCheck("down"), 90*time.Second), guest.XferDown, dropInXfer)
}

// checkLog reads the daemon's log file and checks it holds every want.
//
// It waits up to 10 s for them: a daemon that went to the background logs
// on its own time, and a line about its front-end (stream front-end
// connected) may come after the launcher returned (it failed CI once).
func checkLog(t *testing.T, path string, want ...string) {
	t.Helper()
	var b []byte
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if b, err = os.ReadFile(path); err != nil {
			t.Fatalf("daemon log: %v", err)
		}
		missing := false
		for _, w := range want {
			missing = missing || !bytes.Contains(b, []byte(w))
		}
		if !missing || time.Now().After(deadline) {
			break
		}
	}
	for _, w := range want {
		if !bytes.Contains(b, []byte(w)) {
			t.Errorf("daemon log %s lacks %q:\n%s", path, w, b)
		}
	}
}

// TestQEMUDropInLibvirt runs the command lines libvirt builds for a
// passt-backed interface, then boots the guest on the socket they leave.
//
//   - libvirt 11.3.0 (Debian 13) for <interface type='vhostuser'><backend
//     type='passt'/> with <ip>, <mtu>, <source dev>, <backend logFile>
//     and a <portForward>; the guest's lease must carry the address,
//     prefix and MTU, a download must arrive whole, and a host connection
//     to the forwarded port must reach the guest's listener.
//   - libvirt master's qemuPasstBuildCommand, which adds --hostname and
//     --fqdn: the lease must carry the host name.
//   - libvirt 9.0.0, type='user': the command line (with the guest's MAC
//     as --mac-addr, no --pid, no --vhost-user) must start the daemon on
//     the stream transport and return 0; then QEMU gets the -netdev that
//     libvirt 9.0's qemuPasstAddNetProps builds (JSON: type stream, addr
//     unix PATH, server false; only the id differs) and the guest must
//     get its lease and download through it. (Debian 12's libvirt
//     9.0.0-4+deb12u2 refuses <backend type='passt'/> altogether: its
//     Disable-passt-support patch. So the test plays libvirtd 9.0's part;
//     test/ops' TestLibvirtdPasstBackend has the real libvirtd 11.3, from
//     bookworm-backports, start vunet as passt.)
func TestQEMUDropInLibvirt(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	h := ns.Host
	for _, tc := range []struct {
		name   string
		build  func(callers.LibvirtNet) []string
		guest  string // the guest's address
		mtu    uint
		pid    bool // --pid is passed (libvirt ≥ 9.1)
		stream bool // type='user': QEMU gets -netdev stream
	}{
		{"11.3.0", callers.Libvirt113, "10.7.0.77", 9000, true, false},
		{"master", callers.LibvirtMaster, "10.7.0.78", 4000, true, false},
		{"9.0.0", callers.Libvirt90, "10.7.0.79", 1500, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := qemu.WorkDir(t)
			n := callers.LibvirtNet{
				VhostUser: tc.name != "9.0.0",
				Socket:    filepath.Join(dir, "1-guest-net0.socket"),
				PIDFile:   filepath.Join(dir, "1-guest-net0-passt.pid"),
				MAC:       qemu.DefaultMAC, MTU: tc.mtu, SourceDev: h.Iface,
				LogFile:  filepath.Join(dir, "passt.log"),
				Hostname: "dropin-" + strings.ReplaceAll(tc.name, ".", ""), FQDN: "dropin.e2e.test",
				IPs: []callers.LibvirtIP{{Address: tc.guest, Prefix: uint(h.Prefix)}},
			}
			const hostPort, guestPort = 18022, 8022
			inbound := tc.name == "11.3.0"
			if inbound {
				n.PortForwards = []callers.LibvirtPortForward{{Proto: "tcp", Ranges: []callers.LibvirtRange{{Start: hostPort, To: guestPort}}}}
			}
			callerLaunch(t, ns, tc.build(n), nil, dir)
			if st, err := os.Stat(n.Socket); err != nil || st.Mode()&os.ModeSocket == 0 {
				t.Fatalf("no socket at %s once the command returned: %v", n.Socket, err)
			}
			if tc.pid {
				checkDaemonPID(t, n.PIDFile, dir)
			} else if pids := daemonsNaming(t, dir); len(pids) != 1 {
				t.Fatalf("daemons running: %v, want one", pids)
			}
			if tc.stream {
				checkLog(t, n.LogFile, `msg="vunet starting"`, "transport=stream", "stream transport listening")
			} else {
				checkLog(t, n.LogFile, `msg="vunet starting"`, "transport=vhost-user", "vhost-user listening")
			}

			cfg := qemu.VMConfig{Socket: n.Socket, Params: map[string]string{}}
			if tc.stream {
				cfg.Netdev = callers.Libvirt90Netdev(n, "n0")
			}
			var extra []string
			if inbound {
				cfg.Params[guest.ParamTCPServe] = strconv.Itoa(guestPort)
				extra = append(extra, guest.CheckTCPServe)
			}
			vm := qemu.StartVM(t, dropInVM(srv, cfg, extra...))
			checkDropInGuest(t, srv, vm, lease{
				addr: netip.MustParseAddr(tc.guest), prefix: h.Prefix, router: addrOf(h.Gateway),
				dns: ns.DNS4, mtu: int(tc.mtu),
			})
			r := vm.RequireResult(t, guest.CheckDHCP, time.Second)
			if tc.name == "master" && r.Fields["hostname"] != n.Hostname {
				t.Errorf("lease host name %q, want %q (%s)", r.Fields["hostname"], n.Hostname, r.Format())
			}
			if inbound {
				checkInbound(t, ns, vm, hostPort)
			}
			vm.Finish(t)
		})
	}
}

// checkInbound sends 2 MB to the forwarded host port and expects the
// guest's listener to answer with their size and digest.
func checkInbound(t *testing.T, ns *qemu.NetNS, vm *qemu.VM, hostPort int) {
	t.Helper()
	vm.RequireResult(t, guest.ResultTCPServeReady, 60*time.Second)
	blob := make([]byte, 2<<20)
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
	if _, err := c.Write(blob); err != nil {
		t.Fatalf("send through the forward: %v", err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && err != io.EOF {
		t.Fatalf("guest's answer: %v", err)
	}
	if want := fmt.Sprintf("%d %s\n", len(blob), hex.EncodeToString(sum[:])); answer != want {
		t.Errorf("guest answered %q, want %q", answer, want)
	}
}

// TestQEMUDropInQEMUNetdevPasst plays QEMU 10.1's -netdev passt,vhost-user=on
// with many of its properties: QEMU's socket pair, the command line
// net_passt_decode_args builds (--quiet first, then param=--debug, so the
// last option must win; --fd 3; a pid file QEMU created empty), the exit
// awaited, the pid file read; then QEMU 7.2 gets the other end of the pair.
// The lease must carry the properties' address, netmask, gateway, DNS,
// search list and MTU; the properties vunet cannot honour are each named
// in a start-up warning.
func TestQEMUDropInQEMUNetdevPasst(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	h := ns.Host
	dir := qemu.WorkDir(t)
	pidFile := qemuPasstPIDFile(t, dir)
	logFile := filepath.Join(dir, "passt.log")
	want := lease{addr: netip.MustParseAddr("10.7.0.88"), prefix: 24, router: addrOf(h.Gateway),
		dns: netip.MustParseAddr("10.7.0.99"), mtu: 4000, search: "one.e2e.test"}
	p := callers.QEMUPasst{
		VhostUser: true, MTU: want.mtu, Address: want.addr.String(), Netmask: "255.255.255.0",
		Gateway: want.router.String(), Interface: h.Iface, DNS: want.dns.String(), FQDN: "qemu.e2e.test",
		MapHostLoopback: want.router.String(), MapGuestAddr: "none", OutboundIf4: h.Iface,
		Freebind: callers.Bool(true), IPv6: callers.Bool(false), Search: []string{"one.e2e.test", "two.e2e.test"},
		Param: []string{"--debug", "--log-file", logFile},
	}
	argv := callers.QEMU101(p, pidFile)

	sock := filepath.Join(dir, "qemu-vhost.sock")
	vm := qemu.StartVM(t, dropInVM(srv, qemu.VMConfig{Socket: sock, Server: true}))
	c, err := dialWhileRunning(sock, vm.Exited(), 30*time.Second)
	if err != nil {
		t.Fatalf("QEMU's socket: %v", err)
	}
	passtEnd, err := c.(*net.UnixConn).File()
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	callerLaunch(t, ns, argv, []*os.File{passtEnd}, dir)
	passtEnd.Close() // QEMU: close(sv[1]) once passt has it
	pid := checkDaemonPID(t, pidFile, dir)
	t.Logf("daemon pid %d from %s", pid, pidFile)
	// --quiet came first and param=--debug last: info lines mean the
	// last one won.
	checkLog(t, logFile, `mode=fd`, `msg="vunet starting"`,
		`--outbound-if4 \"v0\" accepted but not supported`, `--freebind accepted but not supported`)
	if b, _ := os.ReadFile(logFile); bytes.Contains(b, []byte("--map-guest-addr")) {
		t.Errorf("--map-guest-addr none (passt's default) warned:\n%s", b)
	}
	vm.ConnectQMP(t)
	checkDropInGuest(t, srv, vm, want)
	checkLog(t, logFile, `level=DEBUG`)
	vm.Finish(t)
}

// qemuPasstPIDFile is the pid file QEMU 10.1 hands passt:
// g_file_open_tmp("passt-XXXXXX.pid"), closed, left empty.
func qemuPasstPIDFile(t *testing.T, dir string) string {
	t.Helper()
	pf, err := os.CreateTemp(dir, "passt-*.pid")
	if err != nil {
		t.Fatal(err)
	}
	pf.Close()
	return pf.Name()
}

// dialWhileRunning dials QEMU's listening socket once it is there.
func dialWhileRunning(path string, exited <-chan struct{}, timeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			return c, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("QEMU exited before listening on %s", path)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
}

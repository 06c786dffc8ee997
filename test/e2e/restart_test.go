package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// tcpLoopFor is how long the guest keeps making TCP round trips in the
// back-end restart tests; the back-end is down for a while in the middle.
const tcpLoopFor = 14 * time.Second

// resumeWithin is how soon after the new back-end is up the guest's TCP
// round trips must work again.
const resumeWithin = 5 * time.Second

// restartGuest is the guest side of the back-end restart tests: DHCP, a
// TCP echo round trip every 100 ms for tcpLoopFor, then a fresh lease and
// a byte-exact transfer from the new daemon.
func restartGuest(srv *qemu.TrafficServer) ([]string, map[string]string) {
	return []string{guest.CheckLink, guest.CheckDHCP, guest.CheckTCPLoop, guest.CheckDHCP + "#2", guest.XferCheck("after")},
		map[string]string{
			guest.ParamTCPLoop:       srv.Target(guest.TargetGW4) + "," + tcpLoopFor.String(),
			guest.XferParam("after"): guest.XferSpec(guest.XferDown, srv.Target(guest.TargetGW4), 10<<20),
			guest.ParamTimeout:       "60s",
		}
}

// checkResumed asserts, on the host's clock, that the echo server saw the
// guest again within resumeWithin of the new daemon being up, and on the
// guest's, that the loop saw the outage and ended with working round trips.
func checkResumed(t *testing.T, vm *qemu.VM, srv *qemu.TrafficServer, killed, restarted time.Time) {
	t.Helper()
	r := vm.RequireResult(t, guest.CheckTCPLoop, tcpLoopFor+30*time.Second)
	accepted, _ := srv.EchoConns()
	var before, after int
	var first time.Time
	for _, a := range accepted {
		switch {
		case a.Before(killed):
			before++
		case first.IsZero():
			first = a
			after++
		default:
			after++
		}
	}
	if before == 0 {
		t.Errorf("no TCP round trip reached the host before the kill (%s)", r.Format())
	}
	if first.IsZero() {
		t.Fatalf("no TCP round trip reached the host after the restart (%s)", r.Format())
	}
	resumed := first.Sub(restarted)
	t.Logf("TCP round trips: %d before the kill, %d after; first one %v after the new daemon was up (%v after the kill); guest: %s",
		before, after, resumed.Round(time.Millisecond), first.Sub(killed).Round(time.Millisecond), r.Format())
	if resumed > resumeWithin {
		t.Errorf("guest networking resumed %v after the new daemon was up, want within %v", resumed.Round(time.Millisecond), resumeWithin)
	}
	last, dur := atoiField(r, "last_ok_ms"), atoiField(r, "duration_ms")
	if last < dur-1000 {
		t.Errorf("last TCP round trip at %d ms of %d: not working at the end (%s)", last, dur, r.Format())
	}
	if atoiField(r, "max_gap_ms") < 500 {
		t.Errorf("longest gap between round trips %s ms: the outage was not seen (%s)", r.Fields["max_gap_ms"], r.Format())
	}
	vm.RequireResult(t, guest.CheckDHCP+"#2", 30*time.Second)
	srv.CheckXfer(t, vm.RequireResult(t, guest.XferCheck("after"), 60*time.Second), guest.XferDown, 10<<20)
}

// TestQEMUBackendRestart kills vunet while the guest is using the link and
// starts a new vunet on the same socket; QEMU (reconnect=1) redials and
// replays the set-up with the rings' used indices, and the guest's TCP
// must work again within resumeWithin without any action on its side.
func TestQEMUBackendRestart(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	d1 := qemu.StartDaemon(t, qemu.DaemonConfig{Name: "daemon1", NetNS: ns})
	checks, params := restartGuest(srv)
	vm := qemu.StartVM(t, qemu.VMConfig{Socket: d1.Socket, Reconnect: 1, Checks: checks, Params: params})
	vm.RequireResult(t, guest.CheckDHCP, 60*time.Second)
	// The loop runs now; let it work, then take the back-end away.
	time.Sleep(3 * time.Second)
	d1.Kill()
	killed := time.Now()
	time.Sleep(time.Second)
	d2 := qemu.StartDaemon(t, qemu.DaemonConfig{Name: "daemon2", NetNS: ns, Socket: d1.Socket})
	restarted := time.Now()
	if !d2.Passt {
		if _, err := d2.Log.Wait(15*time.Second, "queue pair started after restart", qemu.MsgIs("queue pair started")); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("back-end restarted; queue pair running again %v after the kill", time.Since(killed).Round(time.Millisecond))
	checkResumed(t, vm, srv, killed, restarted)
	vm.Finish(t)
}

// TestQEMUDaemonConnects runs vunet in client mode (--connect) against QEMU
// listening (server=on), then kills and restarts vunet: the new process
// dials in and the guest's TCP works again within resumeWithin.
func TestQEMUDaemonConnects(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	sock := filepath.Join(qemu.WorkDir(t), "qemu-vhost.sock")
	checks, params := restartGuest(srv)
	vm := qemu.StartVM(t, qemu.VMConfig{Socket: sock, Server: true, Checks: checks, Params: params})
	d1 := qemu.StartDaemon(t, qemu.DaemonConfig{Name: "daemon1", NetNS: ns, Connect: sock})
	vm.ConnectQMP(t)
	vm.RequireResult(t, guest.CheckDHCP, 60*time.Second)
	if _, err := d1.Log.Wait(5*time.Second, "connected", qemu.MsgIs("vhost-user connected to front-end")); err != nil {
		t.Error(err)
	}
	time.Sleep(3 * time.Second)
	d1.Kill()
	killed := time.Now()
	time.Sleep(time.Second)
	d2 := qemu.StartDaemon(t, qemu.DaemonConfig{Name: "daemon2", NetNS: ns, Connect: sock})
	restarted := time.Now()
	if _, err := d2.Log.Wait(15*time.Second, "queue pair started after restart", qemu.MsgIs("queue pair started")); err != nil {
		t.Fatal(err)
	}
	checkResumed(t, vm, srv, killed, restarted)
	vm.Finish(t)
	// QEMU is gone: the client-mode daemon must survive it, keep retrying,
	// and stop cleanly on SIGTERM.
	if err := d2.Stop(5 * time.Second); err != nil {
		t.Errorf("client-mode daemon on SIGTERM: %v", err)
	}
}

// TestQEMUFrontendRestart kills QEMU in the middle of a 100 MB download
// and boots a new guest on the same vunet socket: the daemon must serve the
// new guest DHCP and byte-exact transfers as if nothing happened, and the
// dead guest's connection towards the host must end eventually.
func TestQEMUFrontendRestart(t *testing.T) {
	qemu.NeedQEMU(t)
	frontendRestart(t, false)
}

// TestQEMUFrontendRestartUnderLoad is TestQEMUFrontendRestart with every
// CPU kept busy by other processes from the kill until the new front-end's
// session is accepted, as in a loaded `make test` run: the dead guest's
// session is torn down slowly, and the new QEMU connects during the
// teardown. It must wait for it, not be turned away (39 refusals were
// counted in one such run). The load ends there: TCG guests booting on
// CPUs shared with busy loops (and a loaded machine) did not report their
// boot in 60 s, which proves nothing about the restart.
func TestQEMUFrontendRestartUnderLoad(t *testing.T) {
	qemu.NeedQEMU(t)
	frontendRestart(t, true)
}

// busyCPUs runs n busy-looping processes until stop is called or the test
// ends.
func busyCPUs(t *testing.T, n int) (stop func()) {
	t.Helper()
	var cmds []*exec.Cmd
	stop = func() {
		for _, cmd := range cmds {
			cmd.Process.Kill()
			cmd.Wait()
		}
		cmds = nil
	}
	t.Cleanup(stop)
	for i := 0; i < n; i++ {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatalf("CPU load: %v", err)
		}
		cmds = append(cmds, cmd)
	}
	t.Logf("%d busy-looping processes on %d CPUs", n, runtime.NumCPU())
	return stop
}

// frontendRestart is the body of the front-end restart tests. With at
// once, the new QEMU starts right after the old one was killed, while its
// session may still be torn down; otherwise once the old guest's
// connections are reset.
func frontendRestart(t *testing.T, atOnce bool) {
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	d := netDaemon(t, ns)
	dir := qemu.WorkDir(t)
	vm1 := qemu.StartVM(t, qemu.VMConfig{
		Dir: mkdir(t, filepath.Join(dir, "vm1")), Socket: d.Socket,
		Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.XferCheck("killed")},
		Params: map[string]string{
			guest.XferParam("killed"): guest.XferSpec(guest.XferDown, srv.Target(guest.TargetGW4), xferSize),
			guest.ParamTimeout:        xferCheckTimeout,
		},
	})
	vm1.RequireResult(t, guest.CheckDHCP, 60*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for srv.DownSent() < 20<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("download did not reach 20 MB in 60 s (%d bytes)", srv.DownSent())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopLoad := func() {}
	if atOnce {
		stopLoad = busyCPUs(t, runtime.NumCPU())
	}
	vm1.Kill()
	killed := time.Now()
	t.Logf("QEMU killed after %d MB of the download", srv.DownSent()>>20)
	startVM2 := func() *qemu.VM {
		return qemu.StartVM(t, qemu.VMConfig{
			Dir: mkdir(t, filepath.Join(dir, "vm2")), Socket: d.Socket,
			Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.XferCheck("down"), guest.XferCheck("up")},
			Params: map[string]string{
				guest.XferParam("down"): guest.XferSpec(guest.XferDown, srv.Target(guest.TargetGW4), 20<<20),
				guest.XferParam("up"):   guest.XferSpec(guest.XferUp, srv.Target(guest.TargetGW4), 20<<20),
				guest.ParamTimeout:      "60s",
			},
		})
	}
	var vm2 *qemu.VM
	if atOnce {
		vm2 = startVM2()
		if !d.Passt {
			pid := float64(vm2.Pid()) // a JSON number
			_, err := d.Log.Wait(30*time.Second, "the new front-end's session", func(l qemu.LogLine) bool {
				return l.Msg == "vhost-user front-end connected" && l.Attrs["pid"] == pid
			})
			if err != nil {
				t.Error(err)
			}
		}
		stopLoad()
		t.Logf("new front-end accepted %v after the kill; CPU load stopped", time.Since(killed).Round(time.Millisecond))
		for _, l := range d.Log.Match(qemu.MsgIs("vhost-user front-end waited for the previous session's teardown")) {
			ns, _ := l.Attrs["waited"].(float64) // a Duration: JSON nanoseconds
			t.Logf("it connected during the teardown and waited %v", time.Duration(ns))
		}
	}
	if !d.Passt {
		if _, err := d.Log.Wait(10*time.Second, "front-end gone", qemu.MsgIs("vhost-user front-end disconnected")); err != nil {
			t.Error(err)
		}
	}
	checkAborted(t, d, srv, killed)
	if !atOnce {
		vm2 = startVM2()
	}
	vm2.RequireResult(t, guest.CheckDHCP, 60*time.Second)
	srv.CheckXfer(t, vm2.RequireResult(t, guest.XferCheck("down"), 60*time.Second), guest.XferDown, 20<<20)
	srv.CheckXfer(t, vm2.RequireResult(t, guest.XferCheck("up"), 60*time.Second), guest.XferUp, 20<<20)
	vm2.Finish(t)
	checkNoRingErrors(t, d)
}

// abortWithin bounds how long the host peer of a killed guest's connection
// may wait: the guest side is gone, so the daemon resets it when the
// front-end leaves (a peer left to its own timeouts would hang for hours
// with a closed window).
const abortWithin = 15 * time.Second

// checkAborted waits for the killed guest's 100 MB download to end on the
// host, short of its size.
func checkAborted(t *testing.T, d *qemu.Daemon, srv *qemu.TrafficServer, killed time.Time) {
	t.Helper()
	for {
		for _, x := range srv.Xfers() {
			if x.Dir == guest.XferDown && x.Want == xferSize {
				t.Logf("killed guest's download ended on the host %v after the kill: %v", time.Since(killed).Round(time.Millisecond), x)
				if x.Err == nil && x.Bytes == xferSize {
					t.Errorf("the killed guest's download completed on the host: %v", x)
				}
				return
			}
		}
		if time.Since(killed) > abortWithin {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	detail := ""
	if m, err := d.Scrape(context.Background()); err == nil {
		detail = fmt.Sprintf(" (daemon: %v established TCP connections, %v retransmissions, %v RSTs sent to guests)",
			m.Sum("vunet_tcp_connections", "state", "established"), m.Sum("vunet_tcp_retransmissions_total"), m.Sum("vunet_tcp_resets_sent_total"))
	}
	t.Errorf("the killed guest's download is still open on the host %v after the kill%s", abortWithin, detail)
}

func mkdir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// atoiField reads an integer field of a result (0 when absent or damaged:
// the assertions then fail with the whole result in the message).
func atoiField(r guest.Result, k string) int {
	n, _ := strconv.Atoi(r.Fields[k])
	return n
}

package e2e

import (
	"strconv"
	"testing"
	"time"

	"vunet/test/guest"
)

// arpLoopFor is how long the guest keeps ARPing in the restart tests; the
// back-end is down for a while in the middle of it.
const arpLoopFor = 12 * time.Second

// TestQEMUBackendRestart kills vunet while the guest is using the link and
// starts a new vunet on the same socket; QEMU (reconnect=1) redials and
// replays the set-up with the rings' used indices, and the guest must get
// ARP answers again without any action on its side.
func TestQEMUBackendRestart(t *testing.T) {
	NeedQEMU(t)
	d1 := StartDaemon(t, DaemonConfig{Name: "daemon1"})
	vm := StartVM(t, VMConfig{
		Socket:    d1.Socket,
		Reconnect: 1,
		Checks:    []string{guest.CheckLink, guest.CheckARPLoop},
		Params: map[string]string{
			guest.ParamAddr:    "10.0.2.15/24",
			guest.ParamARP:     "10.0.2.2",
			guest.ParamARPLoop: arpLoopFor.String(),
			guest.ParamTimeout: "30s",
		},
	})
	vm.RequireResult(t, guest.CheckLink, 60*time.Second)
	// The ARP loop runs now; let it see answers, then take the back-end away.
	time.Sleep(2 * time.Second)
	d1.Kill()
	killed := time.Now()
	time.Sleep(time.Second)
	d2 := StartDaemon(t, DaemonConfig{Name: "daemon2", Socket: d1.Socket})
	if !d2.Passt {
		if _, err := d2.Log.Wait(15*time.Second, "queue pair started after restart", MsgIs("queue pair started")); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("back-end restarted; queue pair running again %v after the kill", time.Since(killed).Round(time.Millisecond))

	r := vm.RequireResult(t, guest.CheckARPLoop, arpLoopFor+30*time.Second)
	checkRecovered(t, r)
	vm.Finish(t)
}

// TestQEMUDaemonConnects runs vunet in client mode (--connect) against QEMU
// listening (server=on), then kills and restarts vunet: the new process
// dials in and the guest's link works again.
func TestQEMUDaemonConnects(t *testing.T) {
	NeedQEMU(t)
	dir := WorkDir(t)
	sock := dir + "/qemu-vhost.sock"
	vm := StartVM(t, VMConfig{
		Socket: sock,
		Server: true,
		Checks: []string{guest.CheckLink, guest.CheckARPLoop},
		Params: map[string]string{
			guest.ParamAddr:    "10.0.2.15/24",
			guest.ParamARP:     "10.0.2.2",
			guest.ParamARPLoop: arpLoopFor.String(),
			guest.ParamTimeout: "40s",
		},
	})
	d1 := StartDaemon(t, DaemonConfig{Name: "daemon1", Connect: sock})
	vm.ConnectQMP(t)
	vm.RequireResult(t, guest.CheckLink, 60*time.Second)
	if _, err := d1.Log.Wait(5*time.Second, "connected", MsgIs("vhost-user connected to front-end")); err != nil {
		t.Error(err)
	}
	time.Sleep(2 * time.Second)
	d1.Kill()
	time.Sleep(time.Second)
	d2 := StartDaemon(t, DaemonConfig{Name: "daemon2", Connect: sock})
	if _, err := d2.Log.Wait(15*time.Second, "queue pair started after restart", MsgIs("queue pair started")); err != nil {
		t.Fatal(err)
	}
	r := vm.RequireResult(t, guest.CheckARPLoop, arpLoopFor+30*time.Second)
	checkRecovered(t, r)
	vm.Finish(t)
	// QEMU is gone: the client-mode daemon must survive it, keep retrying,
	// and stop cleanly on SIGTERM.
	if err := d2.Stop(5 * time.Second); err != nil {
		t.Errorf("client-mode daemon on SIGTERM: %v", err)
	}
}

// checkRecovered reads an arploop result: answers before the outage, a gap
// of at least most of the outage, and answers again at the end.
func checkRecovered(t *testing.T, r guest.Result) {
	t.Helper()
	atoi := func(k string) int { return atoiField(r, k) }
	replies, sent, maxGap, last, dur := atoi("replies"), atoi("sent"), atoi("max_gap_ms"), atoi("last_reply_ms"), atoi("duration_ms")
	if maxGap < 500 {
		t.Errorf("longest gap between ARP replies %d ms: the back-end outage was not seen (%s)", maxGap, r.Format())
	}
	if last < dur-2000 {
		t.Errorf("last ARP reply at %d ms of %d: the guest did not recover after the restart (%s)", last, dur, r.Format())
	}
	if replies < sent/4 {
		t.Errorf("%d replies to %d requests (%s)", replies, sent, r.Format())
	}
}

// atoiField reads an integer field of a result (0 when absent or damaged:
// the assertions then fail with the whole result in the message).
func atoiField(r guest.Result, k string) int {
	n, _ := strconv.Atoi(r.Fields[k])
	return n
}

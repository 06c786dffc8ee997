package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
	"vunet/test/testenv"
)

// The sandbox with a real guest (cmd/vunet/isolation). Every daemon the
// suites start runs sandboxed (checkSandbox fails a test whose daemon did
// not, or whose allow-list refused a call); these tests look at the
// process itself while a guest moves data through it.

// nobodyUID is the user a root-started daemon drops to.
const nobodyUID = 65534

// confinement is what /proc/PID/status must show for every thread.
type confinement struct {
	uid     int
	bounded bool // the capability bounding set is empty too
}

var confinedNobody = confinement{uid: nobodyUID, bounded: true}

// checkConfinedDuringDownload waits until the guest's download is under
// way and then checks the daemon's status, thread by thread.
func checkConfinedDuringDownload(t *testing.T, d *qemu.Daemon, srv *qemu.TrafficServer, want confinement) {
	t.Helper()
	if d.Passt {
		return
	}
	deadline := time.Now().Add(60 * time.Second)
	for srv.DownSent() < 10<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("download did not reach 10 MB in 60 s (%d bytes)", srv.DownSent())
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkConfined(t, d.Pid(), want)
}

// checkConfined reads /proc/PID/status and each task's: the user in all
// four IDs, no capability in any set, no_new_privs, seccomp filter mode.
func checkConfined(t *testing.T, pid int, want confinement) {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) < 2 {
		t.Fatalf("threads of %d: %v (%d)", pid, err, len(tasks))
	}
	u := strconv.Itoa(want.uid)
	expect := map[string]string{
		"Uid": strings.Repeat(u+" ", 3) + u, "CapInh": "0000000000000000", "CapPrm": "0000000000000000",
		"CapEff": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2",
	}
	if want.bounded {
		expect["CapBnd"] = "0000000000000000"
	}
	for _, path := range append([]string{fmt.Sprintf("/proc/%d/status", pid)}, tasks...) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				got[k] = strings.Join(strings.Fields(v), " ")
			}
		}
		for k, v := range expect {
			if got[k] != v {
				t.Errorf("%s: %s %q, want %q", path, k, got[k], v)
			}
		}
	}
	t.Logf("daemon %d: %d threads confined (uid %d, no capabilities, no_new_privs, seccomp)", pid, len(tasks), want.uid)
}

// TestQEMUUnprivilegedSandbox starts the daemon as libvirt starts passt: a
// non-root user with its capabilities cleared (setpriv; the bounding set
// stays, as only CAP_SETPCAP could clear it). The sandbox applies what it
// can, says in one line what it could not, and a guest downloads 100 MB
// byte-exact through the confined daemon.
func TestQEMUUnprivilegedSandbox(t *testing.T) {
	qemu.NeedQEMU(t)
	setpriv := testenv.NeedTool(t, "setpriv", "", "apt-get install util-linux")
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	// The unprivileged daemon creates its socket: a directory it owns.
	dir, err := os.MkdirTemp("", "vunet-e2e-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chown(dir, nobodyUID, nobodyUID); err != nil {
		t.Fatal(err)
	}
	d := qemu.StartDaemon(t, qemu.DaemonConfig{NetNS: ns, Socket: filepath.Join(dir, "vhost.sock"), Metrics: true,
		Wrapper: []string{setpriv, "--reuid=" + strconv.Itoa(nobodyUID), "--regid=" + strconv.Itoa(nobodyUID), "--clear-groups", "--inh-caps=-all"}})
	if !d.Passt {
		l, err := d.Log.Wait(5*time.Second, "sandbox line", qemu.MsgIs("sandbox applied in part"))
		if err != nil {
			t.Fatal(err)
		}
		if na := l.Attr("not_applied"); !strings.Contains(na, "capability bounding set kept") {
			t.Errorf("not_applied %q: want the bounding set named", na)
		}
	}
	params := map[string]string{guest.ParamTimeout: xferCheckTimeout}
	checks := append([]string{guest.CheckLink, guest.CheckDHCP},
		xferParams(params, srv, [2]string{"down4", guest.XferDown + "@" + guest.TargetGW4})...)
	vm := qemu.StartVM(t, qemu.VMConfig{Socket: d.Socket, Checks: checks, Params: params, Timeout: 5 * time.Minute})
	vm.RequireResult(t, guest.CheckDHCP, 60*time.Second)
	checkConfinedDuringDownload(t, d, srv, confinement{uid: nobodyUID})
	srv.CheckXfer(t, vm.RequireResult(t, guest.XferCheck("down4"), 150*time.Second), guest.XferDown, xferSize)
	vm.Finish(t)
	checkNoRingErrors(t, d)
}

package ops

import (
	"context"
	"fmt"
	"os"
	"os/user"
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

// passtLibvirtHint is how to get a libvirt that runs passt: Debian 12's
// own (9.0) refuses <backend type='passt'/> (its Disable-passt-support
// patch); bookworm-backports has 11.3.
const passtLibvirtHint = "libvirt >= 11.1 from bookworm-backports; test/setup/setup.sh test (as root) adds the source and installs it"

// TestLibvirtdPasstBackend has the real libvirtd start vunet as its passt
// backend: a `passt` symlink to vunet first in the PATH of a libvirtd of
// the test's own (see privateLibvirtd), once as qemu:///session of nobody
// and once as qemu:///system (libvirt then runs passt as libvirt-qemu),
// and per daemon one domain per interface type, whose interface has
// <backend type='passt'/> and an <ip> for the guest. libvirt runs "passt
// [--vhost-user] --one-off --socket … --pid … --log-file … --address …
// --netmask …", waits for it to return, and starts QEMU on the socket:
//
//   - vhostuser: <interface type='vhostuser'> (libvirt ≥ 11.1): QEMU
//     connects with vhost-user; the guest RAM is a shared memfd.
//   - user: <interface type='user'>: QEMU connects with -netdev stream.
//
// For each, the process the pid file names must be the vunet binary (as
// the domain's user, in the test's namespace), the command line in the
// domain log must be the expected one, vunet's log must name the
// transport, the guest must get the <ip> as its lease and download a blob
// byte-exact from a server on the namespace's loopback through the
// gateway address, and when the guest powers off the domain and the
// daemon must be gone.
func TestLibvirtdPasstBackend(t *testing.T) {
	testenv.SkipIfShort(t)
	testenv.NeedRoot(t, "a network namespace, libvirtd inside it as root and as nobody")
	qemu.NeedQEMU(t)
	if major, minor, v := libvirtdVersion(t); major < 11 || major == 11 && minor < 1 {
		testenv.Unavailable(t, fmt.Errorf("%s cannot run passt for a vhost-user interface", v), passtLibvirtHint)
	}
	ns := qemu.NewNetNS(t)
	vunetBin := qemu.DaemonBinary(t)
	img := qemu.GuestImage(t)
	qemuUser, err := user.Lookup("libvirt-qemu")
	if err != nil {
		testenv.Unavailable(t, fmt.Errorf("user libvirt-qemu: %w", err), libvirtHint)
	}
	qemuUID, _ := strconv.Atoi(qemuUser.Uid)
	for _, daemon := range []struct {
		name     string
		system   bool
		passtUID int // whom libvirt runs passt (and QEMU) as
	}{
		{"session", false, sessionUID},
		{"system", true, qemuUID},
	} {
		t.Run(daemon.name, func(t *testing.T) {
			dir := qemu.WorkDir(t)
			// The daemon's users enter it: nobody, libvirt-qemu.
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			bin := filepath.Join(dir, "bin")
			if err := os.Mkdir(bin, 0o755); err != nil {
				t.Fatal(err)
			}
			if _, err := callers.PasstLink(bin, vunetBin); err != nil {
				t.Fatal(err)
			}
			// passt's --log-file: a directory its user may write.
			logs := filepath.Join(dir, "passt")
			if err := os.Mkdir(logs, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(logs, daemon.passtUID, -1); err != nil {
				t.Fatal(err)
			}
			lv := startPrivateLibvirtd(t, ns, dir, bin, daemon.system)
			kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.gz")
			copyFile(t, img.Kernel, kernel)
			copyFile(t, img.Initrd, initrd)
			passtBackendDomains(t, lv, ns, dir, logs, kernel, initrd, vunetBin, daemon.passtUID)
		})
	}
}

// passtBackendDomains boots one domain per interface type on lv, its
// interface backed by passt, and checks what TestLibvirtdPasstBackend
// says.
func passtBackendDomains(t *testing.T, lv *privateLibvirtd, ns *qemu.NetNS, dir, logs, kernel, initrd, vunetBin string, passtUID int) {
	for _, tc := range []struct {
		ifType    string // the <interface> type
		addr      string // its <ip>: the guest's lease
		transport string // what vunet's log must say it serves
	}{
		{"vhostuser", "10.7.0.77", "vhost-user"},
		{"user", "10.7.0.79", "stream"},
	} {
		t.Run(tc.ifType, func(t *testing.T) {
			name := fmt.Sprintf("vunet-passt-%s-%d", tc.ifType, os.Getpid())
			page := startPageServer(t, ns, 4<<20)
			passtLog := filepath.Join(logs, name+".log")
			d := testDomain{Name: name, Path: filepath.Join(dir, name+".xml"),
				Console: filepath.Join(dir, name+"-console.log"), Results: filepath.Join(dir, name+"-results.log"),
				Logs: map[string]string{"domain log": lv.domainLog(name), "passt (vunet) log": passtLog}}
			iface := fmt.Sprintf(`<interface type='%s'>
      <mac address='%s'/>
      <ip address='%s' prefix='%d'/>
      <backend type='passt' logFile='%s'/>
      <model type='virtio'/>
      <alias name='ua-vunet0'/>
    </interface>`, tc.ifType, qemu.DefaultMAC, tc.addr, ns.Host.Prefix, xmlEscape(passtLog))
			// vunet's own domain (memfd shared memory, the TCG vectors=0
			// override on alias ua-vunet0) with its interface swapped
			// for the passt-backed one.
			dom := vunetDomain(t, name, filepath.Join(dir, "unused.sock"))
			i, j := strings.Index(dom, "<interface"), strings.Index(dom, "</interface>")
			if i < 0 || j < i {
				t.Fatalf("vunet libvirt-xml --domain has no <interface>:\n%s", dom)
			}
			d.XML = bootableDomain(t, dom[:i]+iface+dom[j+len("</interface>"):], kernel, initrd, fetchCmdline(ns, page), d.Console, d.Results)
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			started := time.Now()
			d.create(t, ctx, lv.virshRun)

			pid := checkPasstIsVunet(t, lv, ns, name, vunetBin, passtUID)
			checkPasstCommand(t, lv.domainLog(name), tc.ifType == "vhostuser", tc.addr)
			checkFileHas(t, passtLog, `msg="vunet starting"`, "transport="+tc.transport)

			byName := d.guestResults(t, ctx)
			if l := byName[guest.CheckDHCP]; l.Fields["ip"] != tc.addr || l.Fields["router"] != ns.Host.Gateway.String() {
				t.Errorf("lease %v: want %s via %s (the <ip> libvirt passed as --address, the namespace's gateway)", l.Fields, tc.addr, ns.Host.Gateway)
			}
			page.checkFetched(t, byName[guest.CheckHTTP].Fields)

			waitDomainGone(t, lv.virshRun, name)
			if err := waitProcessGone(pid, 5*time.Second); err != nil {
				t.Errorf("passt (vunet, pid %d) after the domain ended: %v", pid, err)
			}
			t.Logf("domain %s: libvirtd ran vunet as passt (%s), the guest leased %s and fetched %d bytes, shut off in %v",
				name, tc.transport, tc.addr, page.Size, time.Since(started).Round(time.Millisecond))
		})
	}
}

// checkPasstIsVunet reads the pid file libvirt gave passt and checks it
// names the vunet binary, running as the daemon's user in the test's
// namespace. It returns the pid.
func checkPasstIsVunet(t *testing.T, lv *privateLibvirtd, ns *qemu.NetNS, name, vunetBin string, uid int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := lv.virshRun(ctx, "domid", name)
	if err != nil {
		t.Fatal(err)
	}
	// libvirt's qemuPasstCreatePidFilename: <id>-<first 20 of the name>-<alias>-passt.pid
	// in the driver's passt state directory.
	short := strings.TrimSpace(out) + "-" + name[:min(20, len(name))]
	pidFile := filepath.Join(lv.PasstDir, short+"-ua-vunet0-passt.pid")
	pid, err := callers.ReadPID(pidFile)
	if err != nil {
		t.Fatalf("passt's pid file: %v", err)
	}
	want, _ := filepath.EvalSymlinks(vunetBin)
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || exe != want {
		t.Errorf("passt's pid file %s names %d, running %q (%v); want the vunet binary %s", pidFile, pid, exe, err, want)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d", pid), &st); err != nil || int(st.Uid) != uid {
		t.Errorf("passt (pid %d) runs as uid %d (%v), want %d", pid, st.Uid, err, uid)
	}
	var procNS, testNS syscall.Stat_t
	if syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &procNS) != nil || syscall.Stat(ns.Path, &testNS) != nil || procNS.Ino != testNS.Ino {
		t.Errorf("passt (pid %d) is not in the test's network namespace %s", pid, ns.Name)
	}
	return pid
}

// checkPasstCommand checks the passt command line libvirt logged for the
// domain: argv[0] "passt" (found through PATH), --vhost-user exactly for a
// vhost-user interface, --one-off, and the guest's address.
func checkPasstCommand(t *testing.T, domainLog string, vhostUser bool, addr string) {
	t.Helper()
	b, err := os.ReadFile(domainLog)
	if err != nil {
		t.Fatalf("domain log: %v", err)
	}
	var line string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "passt ") && strings.Contains(l, "--one-off") {
			line = l
			break
		}
	}
	if line == "" {
		t.Fatalf("domain log %s has no passt command line:\n%s", domainLog, b)
	}
	t.Logf("libvirt ran: %s", line)
	if got := strings.Contains(line, "passt --vhost-user "); got != vhostUser {
		t.Errorf("--vhost-user passed: %v, want %v", got, vhostUser)
	}
	if !strings.Contains(line, "--address "+addr+" ") {
		t.Errorf("passt command line lacks --address %s", addr)
	}
}

// checkFileHas fails t unless the file at path holds every want.
func checkFileHas(t *testing.T, path string, want ...string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !strings.Contains(string(b), w) {
			t.Errorf("%s lacks %q:\n%s", path, w, b)
		}
	}
}

// waitProcessGone waits for pid to end (or be a zombie awaiting its reaper).
func waitProcessGone(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return nil
		}
		// "pid (comm) S …": the state follows the last ')'.
		if s := string(b); strings.HasPrefix(strings.TrimSpace(s[strings.LastIndexByte(s, ')')+1:]), "Z") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still running after %v", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

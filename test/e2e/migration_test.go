package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// migrationHoldFor is how long the guest's migration workload runs in
// TestQEMUMigration; the migration happens in the middle.
const migrationHoldFor = 15 * time.Second

// migrationDownload is the size of the download the guest paces over
// migrationHoldFor.
const migrationDownload = 40 << 20

// TestQEMUMigration live-migrates a guest between two QEMU 7.2 processes on
// this host, each on its own vunet, over QMP: the source runs the guest,
// the destination waits with -incoming. The source's vunet runs with
// --migrate-to, the destination's with --migrate-from, so the guest's open
// connections follow it. Throughout, the guest holds one TCP connection
// that echoes a byte every 100 ms, downloads 40 MB paced over the whole
// run, and opens a new TCP connection every 100 ms.
//
// QEMU refuses to migrate a vhost-user guest unless the back-end offers
// VHOST_F_LOG_ALL and VHOST_USER_PROTOCOL_F_LOG_SHMFD, and a back-end that
// does not log what it writes into guest memory while the migration copies
// it hands the destination stale rings and buffers. Checked: the migration
// completes; the source logged its writes (none outside the log); the
// destination's QEMU asked its vunet to announce the guest (SEND_RARP: the
// guest has no GUEST_ANNOUNCE) and that vunet knows the guest's MAC; the
// held connection never failed (its longest silence is printed, on the
// host's clock and on the guest's, where the paused time does not count);
// the download is byte-exact; new connections work on the destination at
// once; the flows were handed over and the source forgot them; the rings
// resume where they stopped, every chain returned (checkRingsHandedOver).
// A destination guest whose kernel crashed after the migration, which
// QEMU 7.2's TCG does now and then without vunet (guestKernelCrash), gets
// one more migration of a new guest; two crashes fail the test.
func TestQEMUMigration(t *testing.T) {
	qemu.NeedQEMU(t)
	for attempt := 1; ; attempt++ {
		// Each attempt in its own subtest: its own work directory, and its
		// daemons and VMs gone before the next starts.
		var crash string
		if !t.Run(fmt.Sprintf("attempt%d", attempt), func(t *testing.T) { crash = migrateOnce(t) }) || crash == "" {
			return
		}
		if attempt == migrationAttempts {
			t.Fatalf("the destination guest's kernel crashed after each of %d migrations; the last: %s", attempt, crash)
		}
		t.Logf("attempt %d: the destination guest's kernel crashed after the migration (%s); "+
			"QEMU 7.2 under TCG does this on a loaded host with no vhost-user back-end at all "+
			"(see kernelCrash): migrating a new guest", attempt, crash)
	}
}

// migrationAttempts is how many migrations TestQEMUMigration makes while
// the destination guest's kernel crashes (kernelCrash).
const migrationAttempts = 2

// migrateOnce makes TestQEMUMigration's migration and checks, failing t
// on any fault of vunet's. If the destination guest's kernel crashed after
// the migration the way QEMU's TCG makes it crash (kernelCrash), and a
// check of the guest's failed, it returns the crash report: the checks
// that need only the daemons, and the ring indexes, were made (and may
// have failed t); those of the guest's traffic were not.
func migrateOnce(t *testing.T) (crash string) {
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	dir := qemu.WorkDir(t)
	srcDir, dstDir := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	for _, d := range []string{srcDir, dstDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	flows := filepath.Join(dir, "flows.sock")
	src := qemu.StartDaemon(t, qemu.DaemonConfig{NetNS: ns, Metrics: true, Name: "src", Socket: filepath.Join(dir, "src.sock"),
		Args: []string{"--migrate-to", flows}})
	if err := waitPath(flows, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	dst := qemu.StartDaemon(t, qemu.DaemonConfig{NetNS: ns, Metrics: true, Name: "dst", Socket: filepath.Join(dir, "dst.sock"),
		Args: []string{"--migrate-from", flows}})
	checks := []string{guest.CheckLink, guest.CheckDHCP, guest.CheckTCPHold}
	params := map[string]string{
		guest.ParamTCPHold: fmt.Sprintf("%s,%s,%d", srv.Target(guest.TargetGW4), migrationHoldFor, migrationDownload),
		guest.ParamTimeout: "60s",
	}
	// Small memory: the migration copies all of it.
	const memMiB = 128
	srcVM := qemu.StartVM(t, qemu.VMConfig{Socket: src.Socket, Dir: srcDir, Checks: checks, Params: params,
		MemoryMiB: memMiB, Timeout: 3 * time.Minute})
	migSock := filepath.Join(dir, "migrate.sock")
	dstVM := qemu.StartVM(t, qemu.VMConfig{Socket: dst.Socket, Dir: dstDir, Checks: checks, Params: params,
		MemoryMiB: memMiB, Timeout: 3 * time.Minute, Incoming: "unix:" + migSock})

	srcVM.RequireResult(t, guest.CheckDHCP, 90*time.Second)
	// The workload runs on the source for a while first.
	if _, err := srv.WaitEchoConns(20, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sentBefore := srv.DownSent()
	started := time.Now()
	info, done, err := srcVM.Migrate(ctx, "unix:"+migSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("migration completed in %v (QEMU: total %d ms, downtime %d ms, %d MB sent, %d dirty syncs); %d MB of the download had gone before",
		done.Sub(started).Round(time.Millisecond), info.TotalTime, info.Downtime, info.RAM.Transferred>>20, info.RAM.DirtySyncs, sentBefore>>20)
	// The source reports completion as it sends the last bytes; the
	// destination runs once it has loaded them.
	for {
		st, err := dstVM.QMP.QueryStatus(ctx)
		if err == nil && st.Running {
			break
		}
		if err != nil || time.Since(done) > 10*time.Second {
			t.Fatalf("destination after the migration: %+v, %v", st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The rings resume where the source stopped them, with every chain
	// the source took given back: no buffer is in flight across the
	// migration, and none is used twice.
	checkRingsHandedOver(t, src, dst)

	// New connections on the destination, at once.
	first, err := srv.WaitEchoConnAfter(done, resumeWithin)
	if err != nil {
		if crash := guestKernelCrash(dstVM); crash != "" {
			checkDaemons(ctx, t, src, dst, srcVM.MAC)
			return crash
		}
		t.Errorf("no new TCP connection reached the host within %v of the migration: %v", resumeWithin, err)
	} else {
		t.Logf("first new TCP connection on the destination %v after the migration completed", first.Sub(done).Round(time.Millisecond))
	}
	r, err := dstVM.WaitResult(guest.CheckTCPHold, migrationHoldFor+60*time.Second)
	if crash := guestKernelCrash(dstVM); crash != "" && (err != nil || !r.OK) {
		checkDaemons(ctx, t, src, dst, srcVM.MAC)
		return crash
	}
	if err != nil || !r.OK {
		// What the server sent, and whether the guest's bytes were its
		// beginning: a short download that matches was cut at the end, one
		// that does not had bytes skipped or changed on the way.
		for _, x := range srv.Xfers() {
			t.Logf("server: %v", x)
			if x.Dir != guest.XferDown || x.Want != migrationDownload {
				continue
			}
			if n, err := strconv.ParseInt(r.Fields["down_bytes"], 10, 64); err == nil && n > 0 && n <= x.Bytes {
				t.Logf("the guest's %d bytes are the stream's first %d: %v", n, n, x.PrefixSHA256(n) == r.Fields["down_sha256"])
			}
		}
		t.Fatalf("guest check %s: %v %s", guest.CheckTCPHold, err, r.Format())
	}
	t.Logf("guest: %s", r.Format())
	dstVM.Finish(t)
	// The TCG guest itself stalls now and then on a loaded host; the
	// silence that spans the migration is the migration's.
	gaps := srv.HeldEchoGaps(done)
	t.Logf("held connection: %d echoes; silence across the migration %v; longest silence of the run %v (host clock), %s ms (guest clock, paused time not counted)",
		gaps.Echoes, gaps.Across.Round(time.Millisecond), gaps.Longest.Round(time.Millisecond), r.Fields["hold_max_gap_ms"])
	t.Logf("new connections: %s of %s worked, longest gap %s ms (guest clock)", r.Fields["new_ok"], r.Fields["new_tries"], r.Fields["new_max_gap_ms"])
	if gaps.Echoes < 10 || gaps.Across == 0 || gaps.Across > resumeWithin {
		t.Errorf("held connection: %d echoes, silence across the migration %v", gaps.Echoes, gaps.Across)
	}
	var down *qemu.XferRecord
	for _, x := range srv.Xfers() {
		if x.Dir == guest.XferDown && x.Want == migrationDownload {
			down = &x
		}
	}
	if down == nil || down.Err != nil || down.Bytes != migrationDownload ||
		r.Fields["down_bytes"] != strconv.Itoa(migrationDownload) || r.Fields["down_sha256"] != down.SHA256 {
		t.Errorf("download across the migration: guest %s bytes sha256 %s; server %+v", r.Fields["down_bytes"], r.Fields["down_sha256"], down)
	}

	checkDaemons(ctx, t, src, dst, srcVM.MAC)
	return ""
}

// checkDaemons makes the checks of TestQEMUMigration that need only the
// two vunets, not the destination guest: the source logged its writes into
// guest memory, none outside QEMU's log; the destination announced the
// guest; the flows went over; no vhost-user error or bad chain anywhere.
func checkDaemons(ctx context.Context, t *testing.T, src, dst *qemu.Daemon, mac string) {
	t.Helper()
	// The flows went over and the source let go of them.
	handed, err := src.Log.Wait(5*time.Second, "the source's COMMIT", qemu.MsgIs("migration: the destination took the guest's flows"))
	if err != nil {
		t.Error(err)
	} else if n, _ := strconv.Atoi(handed.Attr("tcp_connections")); n < 2 {
		t.Errorf("the source handed over %d TCP connections, want the held one and the download", n)
	}
	if _, err := dst.Log.Wait(5*time.Second, "the destination's import", qemu.MsgIs("migration: flows taken over from the source")); err != nil {
		t.Error(err)
	}

	m, err := src.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := m.Sum("vunet_vhost_user_messages_total", "request", "SET_LOG_BASE"); n < 1 {
		t.Errorf("source daemon got %v SET_LOG_BASE: QEMU did not start dirty logging", n)
	}
	if n := m.Sum("vunet_queue_dirty_log_writes_total"); n < 1 {
		t.Errorf("source daemon logged %v writes into guest memory during the migration", n)
	}
	if n := m.Sum("vunet_queue_dirty_log_misses_total"); n != 0 {
		t.Errorf("%v of the source daemon's writes fell outside QEMU's dirty log", n)
	}
	t.Logf("source daemon: %v writes logged during the migration", m.Sum("vunet_queue_dirty_log_writes_total"))
	md, err := dst.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := md.Sum("vunet_vhost_user_messages_total", "request", "SEND_RARP"); n < 1 {
		t.Errorf("destination daemon got %v SEND_RARP: QEMU 7.2 asks a back-end with F_RARP to announce a guest without GUEST_ANNOUNCE", n)
	}
	if _, err := dst.Log.Wait(5*time.Second, "guest announced", func(l qemu.LogLine) bool {
		return l.Msg == "guest announced" && l.Attr("mac") == mac
	}); err != nil {
		t.Error(err)
	}
	for _, d := range []*qemu.Daemon{src, dst} {
		mm, err := d.Scrape(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if bad := mm.Sum("vunet_vhost_user_errors_total") + mm.Sum("vunet_queue_bad_chains_total"); bad != 0 {
			t.Errorf("%v vhost-user errors or bad chains", bad)
		}
	}
}

// checkRingsHandedOver compares the ring indexes the source's vunet last
// stopped its queue pair at (GET_VRING_BASE) with those the destination's
// started it at: the bases must be the same (QEMU carries them), and at
// both ends the used index must equal the base — every chain taken was
// returned before the source answered, and the destination's guest sees
// the used ring the source left.
func checkRingsHandedOver(t *testing.T, src, dst *qemu.Daemon) {
	t.Helper()
	keys := []string{"rx_base", "rx_used", "tx_base", "tx_used"}
	indexes := func(l qemu.LogLine) string {
		v := make([]string, len(keys))
		for i, k := range keys {
			v[i] = k + "=" + l.Attr(k)
		}
		return strings.Join(v, " ")
	}
	pair0 := func(msg string) func(qemu.LogLine) bool {
		return func(l qemu.LogLine) bool { return l.Msg == msg && l.Attr("pair") == "0" }
	}
	// The destination's pair starts on QEMU's SET_VRING_KICK, which QEMU
	// does not wait for: its line may still be on its way.
	first, err := dst.Log.Wait(10*time.Second, "the destination's first queue pair start", pair0("queue pair started"))
	stops := src.Log.Match(pair0("queue pair stopped"))
	if err != nil || len(stops) == 0 {
		t.Errorf("ring indexes: %d queue pair stops logged by the source; the destination's start: %v", len(stops), err)
		return
	}
	last := stops[len(stops)-1]
	a, b := indexes(last), indexes(first)
	switch {
	case a != b:
		t.Errorf("ring indexes: the source stopped at %s, the destination started at %s", a, b)
	case last.Attr("rx_base") != last.Attr("rx_used") || last.Attr("tx_base") != last.Attr("tx_used"):
		t.Errorf("ring indexes: the source stopped with chains not returned (used index behind the base): %s", a)
	default:
		t.Logf("ring indexes across the migration: %s", a)
	}
}

// guestKernelCrash returns kernelCrash of vm's console ("" if none).
func guestKernelCrash(vm *qemu.VM) string {
	b, err := os.ReadFile(vm.Console)
	if err != nil {
		return ""
	}
	return kernelCrash(string(b))
}

// kernelCrash returns the first three lines of the kernel crash report in a
// console log, joined with " | ", if it is one QEMU 7.2's TCG causes, and
// "" otherwise.
//
// Live migration under TCG on a loaded host crashes the destination
// guest's kernel now and then, a second or two after the switch, on its
// timers, lists and stacks: an hrtimer whose function is NULL in the timer
// interrupt, a list_del corruption in do_epoll_wait (on a wait entry whose
// addresses are a kernel stack's), a list_add corruption, a stack
// protector's "Kernel stack is corrupted". It does so with no vhost-user
// back-end at all: with the guest on "-netdev stream" (QEMU's own
// virtio-net; vunet never touches guest memory), under the same load (go
// test -race of two packages in a loop), 3 of 67 migrations crashed (the
// hrtimer, the list_add, the stack), against 3 of 120 with vhost-user (2
// the hrtimer, 1 the list_del; 2026-12-03/04). It is not vunet's to fix,
// and no check of the guest's traffic can run on a guest whose kernel
// died.
//
// Only those reports count. What a device fault makes the guest print —
// a used element for a chain it did not post ("is not a head"), a
// transmit queue that timed out (NETDEV WATCHDOG, a WARNING) — never does,
// even next to one: that is a failure of vunet's.
func kernelCrash(console string) string {
	if deviceFault.MatchString(console) {
		return ""
	}
	var crash []string
	for _, l := range strings.Split(console, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && (len(crash) > 0 || kernelCrashLine.MatchString(l)) {
			crash = append(crash, l)
		}
		if len(crash) == 3 {
			break
		}
	}
	if len(crash) == 0 || !tcgCrash.MatchString(console) {
		return ""
	}
	return strings.Join(crash, " | ")
}

// deviceFault matches what a Linux guest prints about a misbehaving
// virtio-net device or a stuck transmit queue.
var deviceFault = regexp.MustCompile(`is not a head|NETDEV WATCHDOG|transmit queue \d+ timed out|virtio_net .*(error|unexpected)|virtqueue.*broken`)

// tcgCrash matches the crashes seen under TCG (see kernelCrash).
var tcgCrash = regexp.MustCompile(`__hrtimer_run_queues|kernel/time/hrtimer\.c|` +
	`list_del corruption[^\n]*\n(?s:.*)do_epoll_wait|list_add corruption|stack-protector: Kernel stack is corrupted`)

// kernelCrashLine matches the first line of a Linux oops, BUG, WARNING or
// panic report.
var kernelCrashLine = regexp.MustCompile(`^\[ *[0-9]+\.[0-9]+\] (BUG:|Oops:|WARNING:|Kernel panic|kernel BUG|list_del corruption|list_add corruption|general protection fault)`)

// waitPath waits for a file (a daemon's socket) to exist.
func waitPath(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v", path, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

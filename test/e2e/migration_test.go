package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// migrationLoopFor is how long the guest keeps making TCP round trips in
// TestQEMUMigration; the migration happens in the middle.
const migrationLoopFor = 12 * time.Second

// TestQEMUMigration live-migrates a guest between two QEMU 7.2 processes on
// this host, each on its own vunet, over QMP: the source runs the guest,
// the destination waits with -incoming. The guest opens a new TCP echo
// connection to the host every 100 ms throughout. QEMU refuses to migrate
// a vhost-user guest unless the back-end offers VHOST_F_LOG_ALL and
// VHOST_USER_PROTOCOL_F_LOG_SHMFD, and a back-end that does not log what it
// writes into guest memory while the migration copies it hands the
// destination stale rings and buffers. Checked: the migration completes,
// the source daemon logged its writes (and none fell outside the log),
// the destination's QEMU asked its daemon to announce the guest
// (SEND_RARP: the guest has no GUEST_ANNOUNCE) and its daemon knows the
// guest's MAC, and new connections work on the destination at once (host
// clock: the first round trip after the migration; guest clock: the
// longest silence of the loop, in which the paused time does not count).
func TestQEMUMigration(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	srv := qemu.StartTrafficServer(t, ns)
	dir := qemu.WorkDir(t)
	srcDir, dstDir := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	for _, d := range []string{srcDir, dstDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	src := qemu.StartDaemon(t, qemu.DaemonConfig{NetNS: ns, Metrics: true, Name: "src", Socket: filepath.Join(dir, "src.sock")})
	dst := qemu.StartDaemon(t, qemu.DaemonConfig{NetNS: ns, Metrics: true, Name: "dst", Socket: filepath.Join(dir, "dst.sock")})
	checks := []string{guest.CheckLink, guest.CheckDHCP, guest.CheckTCPLoop}
	params := map[string]string{
		guest.ParamTCPLoop: srv.Target(guest.TargetGW4) + "," + migrationLoopFor.String(),
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
	// A few round trips on the source first.
	if _, err := srv.WaitEchoConns(3, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	started := time.Now()
	info, done, err := srcVM.Migrate(ctx, "unix:"+migSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("migration completed in %v (QEMU: total %d ms, downtime %d ms, %d MB sent, %d dirty syncs)",
		done.Sub(started).Round(time.Millisecond), info.TotalTime, info.Downtime, info.RAM.Transferred>>20, info.RAM.DirtySyncs)
	if st, err := dstVM.QMP.QueryStatus(ctx); err != nil || !st.Running {
		t.Fatalf("destination after the migration: %+v, %v", st, err)
	}

	// New connections on the destination, at once.
	first, err := srv.WaitEchoConnAfter(done, resumeWithin)
	if err != nil {
		t.Errorf("no TCP round trip reached the host within %v of the migration: %v", resumeWithin, err)
	} else {
		t.Logf("first TCP round trip on the destination %v after the migration completed", first.Sub(done).Round(time.Millisecond))
	}
	r := dstVM.RequireResult(t, guest.CheckTCPLoop, migrationLoopFor+30*time.Second)
	t.Logf("guest's TCP loop across the migration: %d round trips tried, longest silence %s ms (guest clock)",
		atoiField(r, "tries"), r.Fields["max_gap_ms"])
	if last, dur := atoiField(r, "last_ok_ms"), atoiField(r, "duration_ms"); last < dur-1000 {
		t.Errorf("the loop's last round trip at %d ms of %d: connections stopped working (%s)", last, dur, r.Format())
	}
	dstVM.Finish(t)

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
		return l.Msg == "guest announced" && l.Attr("mac") == srcVM.MAC
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

package qemuvm

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
	rig "vunet/test/rig/lib"
)

func TestMain(m *testing.M) { os.Exit(qemu.RunMain(m)) }

// Backend is one back-end to measure.
type Backend struct {
	Name     string `json:"name"`
	Template string `json:"template"`
}

// Row is one measurement of one back-end, as test/bench reads it.
type Row struct {
	Backend     string  `json:"backend"`
	Test        string  `json:"test"` // download, upload, rr_p50, rr_p99
	Value       float64 `json:"value"`
	Unit        string  `json:"unit"`
	Bytes       int64   `json:"bytes,omitempty"`
	CPUSeconds  float64 `json:"cpu_seconds,omitempty"`
	CPUSecPerGB float64 `json:"cpu_s_per_gb,omitempty"`
	// CPUUserShare is the part of CPUSeconds spent in user space: the rest
	// is the kernel's, on the back-end's behalf (system calls, wake-ups).
	CPUUserShare float64 `json:"cpu_user_share,omitempty"`
	// Sleeps and Preemptions are the back-end's voluntary and involuntary
	// context switches over the row, summed over its threads: what a
	// wake-up costs is paid per switch, and more so in a VM.
	Sleeps      int64   `json:"sleeps,omitempty"`
	Preemptions int64   `json:"preemptions,omitempty"`
	Seconds     float64 `json:"seconds,omitempty"`
	Count       int     `json:"count,omitempty"`
	Error       string  `json:"error,omitempty"`
}

func BenchmarkQEMUGuest(b *testing.B) {
	out := os.Getenv("VUNET_BENCH_QEMU_OUT")
	if out == "" {
		b.Skip("run by test/bench (make bench): set VUNET_BENCH_QEMU_OUT to run it by hand")
	}
	var backends []Backend
	if err := json.Unmarshal([]byte(os.Getenv("VUNET_BENCH_QEMU_BACKENDS")), &backends); err != nil || len(backends) == 0 {
		b.Fatalf("VUNET_BENCH_QEMU_BACKENDS: want a JSON list of {name, template}: %v", err)
	}
	size := int64(300e6)
	if v := os.Getenv("VUNET_BENCH_QEMU_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			b.Fatalf("VUNET_BENCH_QEMU_BYTES=%q", v)
		}
		size = n
	}
	rr := 3 * time.Second
	if v := os.Getenv("VUNET_BENCH_QEMU_RR"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("VUNET_BENCH_QEMU_RR=%q", v)
		}
		rr = d
	}
	qemu.NeedQEMU(b)
	var rows []Row
	for i := 0; i < b.N; i++ {
		for _, be := range backends {
			b.Run(be.Name, func(b *testing.B) { rows = append(rows, measure(b, be, size, rr)...) })
		}
	}
	buf, err := json.MarshalIndent(rows, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(out, buf, 0o644); err != nil {
		b.Fatal(err)
	}
}

// measure boots one guest on be and runs the download, the upload and the
// round trips, in that order.
func measure(b *testing.B, be Backend, size int64, rr time.Duration) []Row {
	ns := qemu.NewNetNS(b)
	srv := qemu.StartTrafficServer(b, ns)
	dir := qemu.WorkDir(b)
	sock := filepath.Join(dir, "vhost.sock")
	pid := startBackend(b, be, ns, sock, filepath.Join(dir, "backend.log"))

	xferTimeout := time.Duration(size/1e6)*time.Second + 60*time.Second // ≥ 8 Mbit/s
	params := map[string]string{
		guest.ParamTimeout:      (xferTimeout + 10*time.Second).String(),
		guest.XferParam("down"): guest.XferSpec(guest.XferDown, srv.Target(guest.TargetGW4), size),
		guest.XferParam("up"):   guest.XferSpec(guest.XferUp, srv.Target(guest.TargetGW4), size),
		guest.ParamRR:           srv.Target(guest.TargetGW4) + "," + rr.String(),
	}
	checks := []string{guest.CheckLink, guest.CheckDHCP, guest.XferCheck("down"), guest.XferCheck("up"), guest.CheckRR}
	vm := qemu.StartVM(b, qemu.VMConfig{Socket: sock, Checks: checks, Params: params, Timeout: 2*xferTimeout + 3*time.Minute})
	vm.RequireResult(b, guest.CheckDHCP, 90*time.Second)

	var rows []Row
	cpu, user := cpuSeconds(b, pid)
	vol, invol := contextSwitches(pid)
	for _, x := range []struct{ label, dir, test string }{{"down", guest.XferDown, "download"}, {"up", guest.XferUp, "upload"}} {
		start := time.Now()
		r := vm.RequireResult(b, guest.XferCheck(x.label), xferTimeout+30*time.Second)
		c, u := cpuSeconds(b, pid)
		v, iv := contextSwitches(pid)
		// The row's time ends with its CPU reading: the server-side check
		// below may wait seconds for the last bytes, and counting them in
		// the time but not in the CPU made the back-end look idler.
		secs := time.Since(start).Seconds()
		srv.CheckXfer(b, r, x.dir, size)
		mbps, _ := strconv.ParseFloat(r.Fields["mbps"], 64)
		rows = append(rows, Row{Backend: be.Name, Test: x.test, Value: mbps / 1000, Unit: "Gbit/s", Bytes: size,
			CPUSeconds: c - cpu, CPUSecPerGB: (c - cpu) / (float64(size) / 1e9), CPUUserShare: share(u-user, c-cpu),
			Sleeps: v - vol, Preemptions: iv - invol, Seconds: secs})
		cpu, user, vol, invol = c, u, v, iv
	}
	// The round trips' CPU, warm-up and connection included: a back-end
	// that answers sooner by spinning between requests shows it here. The
	// guest powers off once the last check reports, and a one-off
	// back-end (passt -1) exits with it: its CPU time is sampled while the
	// round trips run.
	first, sample := sampleCPU(b, pid)
	b.Cleanup(func() { sample() }) // a failed RequireResult stops the sampling too
	r := vm.RequireResult(b, guest.CheckRR, rr+60*time.Second)
	last := sample()
	rrCPU, rrSecs := last.total-first.total, last.at.Sub(first.at).Seconds()
	rrUser := share(last.user-first.user, rrCPU)
	n, _ := strconv.Atoi(r.Fields["n"])
	for _, q := range []string{"p50", "p99"} {
		v, err := strconv.ParseFloat(r.Fields[q+"_us"], 64)
		row := Row{Backend: be.Name, Test: "rr_" + q, Value: v, Unit: "µs", Count: n,
			CPUSeconds: rrCPU, CPUUserShare: rrUser, Seconds: rrSecs}
		if err != nil {
			row.Error = fmt.Sprintf("rr result %s", r.Format())
		}
		rows = append(rows, row)
	}
	vm.Finish(b)
	for _, row := range rows {
		b.Logf("%s %s: %v %s (cpu %.2f s/GB, %.0f%% user, %d sleeps, %d preemptions)", row.Backend, row.Test, row.Value, row.Unit,
			row.CPUSecPerGB, 100*row.CPUUserShare, row.Sleeps, row.Preemptions)
	}
	return rows
}

// startBackend starts be's command in ns, listening on sock, and waits for
// the socket; t.Cleanup stops it. It returns the back-end's pid (ip netns
// exec execs in place).
func startBackend(b *testing.B, be Backend, ns *qemu.NetNS, sock, logPath string) int {
	vars := map[string]string{"{socket}": sock, "{metrics}": "127.0.0.1:0"}
	if strings.Contains(be.Template, "{vunet}") {
		vars["{vunet}"] = qemu.DaemonBinary(b)
	}
	var argv []string
	for _, f := range strings.Fields(be.Template) {
		for k, v := range vars {
			f = strings.ReplaceAll(f, k, v)
		}
		argv = append(argv, f)
	}
	argv = ns.Command(argv...)
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", be.Name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logFile.Close(); close(exited) }()
	b.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			b.Fatalf("%s exited before listening:\n%s", be.Name, log)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: no socket %s after 10s", be.Name, sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Logf("%s: %s (pid %d)", be.Name, strings.Join(argv, " "), cmd.Process.Pid)
	return cmd.Process.Pid
}

// cpuSeconds is the process's user+system CPU time so far, and the user
// part alone.
func cpuSeconds(b *testing.B, pid int) (total, user float64) {
	r, err := readCPU(pid)
	if err != nil {
		b.Fatalf("back-end cpu: %v", err)
	}
	return r.total, r.user
}

// readCPU reads pid's CPU time now.
func readCPU(pid int) (cpuReading, error) {
	u, sys, err := rig.ProcCPU(pid)
	return cpuReading{total: u + sys, user: u, at: time.Now()}, err
}

// cpuReading is a process's CPU time (total and user, seconds) read at
// a moment.
type cpuReading struct {
	total, user float64
	at          time.Time
}

// sampleCPU reads pid's CPU time now (first) and then every 20 ms; stop
// ends the sampling and returns the last reading (the process may have
// exited since: then the last it gave). stop may be called more than once.
func sampleCPU(b *testing.B, pid int) (first cpuReading, stop func() cpuReading) {
	first, err := readCPU(pid)
	if err != nil {
		b.Fatalf("back-end cpu: %v", err)
	}
	var (
		mu   sync.Mutex
		last = first
	)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				r, err := readCPU(pid)
				if err != nil {
					return
				}
				mu.Lock()
				last = r
				mu.Unlock()
			}
		}
	}()
	var once sync.Once
	return first, func() cpuReading {
		once.Do(func() {
			close(done)
			<-stopped
			if r, err := readCPU(pid); err == nil {
				last = r
			}
		})
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}

// contextSwitches sums the voluntary and involuntary context switches of
// the process's threads (those still running: an exited thread's are lost,
// and the back-ends keep theirs).
func contextSwitches(pid int) (vol, invol int64) {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		v, err := rig.ProcFields(t, []string{"voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"}, nil)
		if err == nil { // a thread that exited meanwhile counts for neither
			vol += v[0]
			invol += v[1]
		}
	}
	return vol, invol
}

// share is part/whole, 0 for an empty whole.
func share(part, whole float64) float64 {
	if whole <= 0 {
		return 0
	}
	return part / whole
}

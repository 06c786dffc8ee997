package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	rig "vunet/test/rig/lib"
)

// defaultVunet is vunet as the rig runs it, with the TCP flow table raised
// above the idle-connection count (the default, 4096 per queue pair, would
// refuse connections past it).
const defaultVunet = "{vunet} --socket {socket} --one-off --metrics {metrics} --max-tcp-flows 16384"

type settings struct {
	out            string
	seconds        int
	rrTime         time.Duration
	idle           int
	mtus           []int
	udpRate        string
	udpGSO         bool
	micro          bool
	microBenchtime string
	vunet, peer    string
	peerTestpmd    string // the peer's template for the testpmd rows
	peerName       string
	testpmd        bool
	rigRounds      bool
	throughput     bool
	lossy          bool
	qemu           bool
	qemuBytes      int64
	qemuRounds     int
	verbose        bool
}

func main() {
	var s settings
	var mtus string
	flag.StringVar(&s.out, "out", "bench-results.json", "write the results as JSON to this `file`")
	flag.IntVar(&s.seconds, "t", 3, "`seconds` per iperf3 run")
	flag.DurationVar(&s.rrTime, "rr-time", 2*time.Second, "duration of the latency and of the connection-rate test")
	flag.IntVar(&s.idle, "idle-conns", 10000, "idle TCP connections opened through the back-end for the RSS test (0: skip)")
	flag.StringVar(&mtus, "mtus", "1500,65520", "guest `MTUs` for the TCP throughput tests (UDP runs at the first, latency and idle tests at the last)")
	flag.StringVar(&s.udpRate, "udp-rate", "10G", "iperf3 -b target `rate` for UDP (high enough to saturate)")
	flag.BoolVar(&s.udpGSO, "udp-gso", true, "with the UDP rows, also run UDP with segmentation offload both ways (sends of 44 datagrams with UDP_SEGMENT, receives with UDP_GRO)")
	flag.BoolVar(&s.micro, "micro", true, "run the Go micro-benchmarks of the hot paths too")
	flag.StringVar(&s.microBenchtime, "micro-benchtime", "200ms", "go test -benchtime for the micro-benchmarks")
	flag.StringVar(&s.vunet, "vunet", defaultVunet, "vunet's command `template` ({socket} {metrics} {vunet})")
	flag.StringVar(&s.peer, "peer", os.Getenv("VUNET_BENCH_PEER"), "a second back-end's command `template` with {socket} (default $VUNET_BENCH_PEER); split on spaces")
	flag.StringVar(&s.peerTestpmd, "peer-testpmd", os.Getenv("VUNET_BENCH_PEER_TESTPMD"), "the peer's command `template` for the testpmd rows (default $VUNET_BENCH_PEER_TESTPMD, else -peer; for passt, -peer with --pcap /dev/null: see testpmdPeer)")
	flag.StringVar(&s.peerName, "peer-name", "", "the peer's name in the table (default: its command's base name)")
	flag.BoolVar(&s.rigRounds, "rig", true, "run the rig rounds (kernel, rig alone, vunet, peer at each MTU)")
	flag.BoolVar(&s.throughput, "throughput", true, "run the rig rounds' iperf3 TCP and UDP rows (false: only latency, connection rate, RSS and idle connections)")
	flag.BoolVar(&s.lossy, "lossy", true, "run TCP over a lossy link (1% loss, 1% reordering, 0.5% duplication each way, made by the rig) through each back-end and through the rig alone")
	flag.BoolVar(&s.testpmd, "testpmd", true, "also run TCP through DPDK testpmd as the front-end (skipped with a note when dpdk-testpmd is missing)")
	flag.BoolVar(&s.qemu, "qemu", true, "also run a QEMU TCG guest through each back-end (skipped with a note when QEMU is missing)")
	flag.Int64Var(&s.qemuBytes, "qemu-bytes", 300e6, "`bytes` per QEMU download and upload")
	flag.IntVar(&s.qemuRounds, "qemu-rounds", 3, "QEMU `rounds`, each back-end once per round, interleaved; rows give the median and the spread")
	flag.BoolVar(&s.verbose, "v", false, "log the rig's own steps")
	flag.Parse()
	for _, f := range strings.Split(mtus, ",") {
		m, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || m < 68 || m > 65535 {
			fatal(fmt.Errorf("-mtus: bad MTU %q", f))
		}
		s.mtus = append(s.mtus, m)
	}
	s.peer = strings.TrimSpace(s.peer)
	if s.peer != "" && s.peerName == "" {
		// The program, not a wrapper such as taskset, where it is passt.
		fs := strings.Fields(s.peer)
		s.peerName = fs[max(passtIndex(fs), 0)]
		if i := strings.LastIndexByte(s.peerName, '/'); i >= 0 {
			s.peerName = s.peerName[i+1:]
		}
		if s.peerName == "vunet" || s.peerName == "kernel" || s.peerName == "{vunet}" {
			s.peerName = "peer"
		}
	}
	s.peerTestpmd = strings.TrimSpace(s.peerTestpmd)
	if s.peer == "" && s.peerTestpmd != "" {
		fatal(errors.New("-peer-testpmd (VUNET_BENCH_PEER_TESTPMD) needs -peer (VUNET_BENCH_PEER): it is that peer's command for the testpmd rows"))
	}
	if s.peer != "" && s.peerTestpmd == "" {
		s.peerTestpmd = testpmdPeer(s.peer)
	}
	if err := prerequisites(s); err != nil {
		fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, s)
	rig.Cleanup()
	if err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// prerequisites checks what the run needs and says how to get it.
func prerequisites(s settings) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, TAP devices): run as root, e.g. sudo make bench")
	}
	for _, tool := range []struct{ bin, pkg string }{
		{"iperf3", "iperf3"}, {"ip", "iproute2"}, {"ss", "iproute2"}, {"go", "golang (or a Go toolchain from go.dev)"},
	} {
		if _, err := exec.LookPath(tool.bin); err != nil {
			return fmt.Errorf("%s not found in PATH: apt-get install %s", tool.bin, tool.pkg)
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("/dev/net/tun: %w (modprobe tun)", err)
	}
	for _, p := range []struct {
		name, tmpl string
		used       bool
	}{{"VUNET_BENCH_PEER", s.peer, true}, {"VUNET_BENCH_PEER_TESTPMD", s.peerTestpmd, s.testpmd}} {
		if p.tmpl == "" || !p.used {
			continue
		}
		if !strings.Contains(p.tmpl, "{socket}") {
			return fmt.Errorf("%s must contain {socket}, where the peer listens for the front-end", p.name)
		}
		if _, err := exec.LookPath(strings.Fields(p.tmpl)[0]); err != nil {
			return fmt.Errorf("peer back-end (%s): %w", p.name, err)
		}
	}
	return nil
}

// raiseNoFile lifts this process's open-files limit to want (the idle
// test's guest ends are all here); children, the back-ends among them,
// inherit the new limit. Raising the hard limit needs CAP_SYS_RESOURCE: if
// that is missing, a hard limit that already suffices will do.
func raiseNoFile(want uint64) (string, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return "", err
	}
	before := fmt.Sprintf("%d/%d", l.Cur, l.Max)
	if l.Cur >= want {
		return "RLIMIT_NOFILE (soft/hard) " + before + " is enough here, not raised", nil
	}
	n := syscall.Rlimit{Cur: want, Max: max(want, l.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n); err == nil {
		return fmt.Sprintf("raised RLIMIT_NOFILE (soft/hard) from %s to %d/%d; the back-ends inherit it", before, n.Cur, n.Max), nil
	} else if l.Max < want {
		return "", fmt.Errorf("RLIMIT_NOFILE hard limit %d is below %d and cannot be raised (%w): run with CAP_SYS_RESOURCE, ulimit -Hn %d, or a smaller -idle-conns", l.Max, want, err, want)
	}
	n = syscall.Rlimit{Cur: l.Max, Max: l.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n); err != nil {
		return "", fmt.Errorf("raise RLIMIT_NOFILE soft limit to %d: %w", l.Max, err)
	}
	return fmt.Sprintf("raised RLIMIT_NOFILE soft limit from %s to %d/%d", before, n.Cur, n.Max), nil
}

// runner accumulates the report.
type runner struct {
	s      settings
	rep    Report
	logger *slog.Logger
	udpgso string // the UDP GSO rows' tool (udpgso.go); "" without them
}

func (r *runner) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.rep.Notes = append(r.rep.Notes, msg)
	fmt.Fprintln(os.Stderr, "note:", msg)
}

func (r *runner) add(res Result) {
	r.rep.Results = append(r.rep.Results, res)
	v := num(res.Value) + " " + res.Unit
	if res.Error != "" {
		v = "ERROR " + res.Error
	}
	fmt.Fprintf(os.Stderr, "  %-44s %-8s %s\n", res.Label, res.Backend, v)
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m (run inside vunet's source tree): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func run(ctx context.Context, s settings) error {
	start := time.Now()
	lvl := slog.LevelWarn
	if s.verbose {
		lvl = slog.LevelInfo
	}
	r := &runner{s: s, logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))}
	var uts syscall.Utsname
	syscall.Uname(&uts)
	rel := make([]byte, 0, len(uts.Release))
	for _, c := range uts.Release {
		if c == 0 {
			break
		}
		rel = append(rel, byte(c))
	}
	r.rep = Report{
		Started:  start.UTC().Format(time.RFC3339),
		Kernel:   string(rel),
		CPUs:     runtime.NumCPU(),
		Backends: map[string]string{"vunet": s.vunet, "kernel": "veth pair between two namespaces"},
		Settings: map[string]any{"iperf_seconds": s.seconds, "rr_seconds": s.rrTime.Seconds(),
			"idle_conns": s.idle, "mtus": s.mtus, "udp_rate": s.udpRate, "udp_payload": udpLen},
	}
	if s.peer != "" {
		r.rep.Backends[s.peerName] = s.peer
		if s.testpmd && s.peerTestpmd != s.peer {
			r.rep.Backends[s.peerName+" (testpmd rows)"] = s.peerTestpmd
		}
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	if s.idle > 0 {
		msg, err := raiseNoFile(uint64(s.idle + 1024))
		if err != nil {
			return err
		}
		r.note("%s", msg)
	}
	// Build vunet once up front, so a broken tree fails before any rig.
	if strings.Contains(s.vunet, "{vunet}") {
		bin, err := rig.VunetBinary()
		if err != nil {
			return err
		}
		fmt.Fprintln(os.Stderr, "vunet binary:", bin)
	}
	if s.udpGSO && s.throughput && s.rigRounds {
		dir, err := udpGSODir()
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if r.udpgso, err = buildUDPGSO(root, dir); err != nil {
			return err
		}
	}
	if err := rig.Sweep(); err != nil {
		r.note("sweep of stale rigs: %v", err)
	}
	for i, mtu := range s.mtus {
		if !s.rigRounds {
			break
		}
		if err := r.mtuRound(ctx, mtu, i == 0, i == len(s.mtus)-1); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if s.lossy && ctx.Err() == nil {
		r.lossySection(ctx)
	}
	if s.testpmd {
		r.testpmdSection(ctx)
	}
	if s.qemu {
		r.qemuSection(ctx, root)
	}
	finalize(r.rep.Results, s.peerName)
	if s.micro {
		fmt.Fprintln(os.Stderr, "micro-benchmarks:", strings.Join(microPackages, " "))
		ms, raw, err := runMicro(ctx, root, s.microBenchtime)
		r.rep.Micro = ms
		if err != nil {
			r.rep.MicroErr = err.Error()
			fmt.Fprintln(os.Stderr, raw)
			r.note("micro-benchmarks: %v", err)
		}
	}
	r.rep.Seconds = time.Since(start).Seconds()

	fmt.Println()
	printTable(os.Stdout, r.rep.Results, s.peerName)
	if len(r.rep.Micro) > 0 {
		fmt.Println()
		printMicro(os.Stdout, r.rep.Micro)
	}
	if len(r.rep.Notes) > 0 {
		fmt.Println()
		for _, n := range r.rep.Notes {
			fmt.Println("note:", n)
		}
	}
	b, err := json.MarshalIndent(r.rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(s.out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s (%.0f s)\n", s.out, r.rep.Seconds)
	return nil
}

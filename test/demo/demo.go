package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"vunet/test/guest"
	"vunet/test/guest/initramfs"
	"vunet/test/qemu"
)

// Config says how to run the demo.
type Config struct {
	Out     io.Writer // human-readable progress; default os.Stdout
	Verbose bool      // copy vunet's log lines to Out as well
	Keep    bool      // keep the work directory even on success
	// Timeout bounds the demo proper, from starting vunet to cleaning up
	// (default 90 s); BuildTimeout bounds compiling vunet and the guest
	// agent, which on a fresh machine with a cold Go cache depends on the
	// machine more than on the demo (default 5 minutes).
	Timeout      time.Duration
	BuildTimeout time.Duration
	QEMU         string // QEMU binary; default qemu-system-x86_64 from PATH
}

// Report is what the demo saw, for its test to assert on.
type Report struct {
	WorkDir   string
	Gateway   string            // the gateway address vunet announced
	Lease     map[string]string // the guest's dhcp result fields (ip, mask, router, ...)
	HTTP      map[string]string // the guest's http result fields (status, bytes, sha256, ...)
	PageSHA   string            // what the server sent
	Served    []servedRequest
	Metrics   qemu.Metrics // scrape taken after the guest powered off
	GuestTook time.Duration
	BuildTook time.Duration // building vunet and the guest image
	RunTook   time.Duration // from starting vunet to the end
	Took      time.Duration // everything
}

// MissingError is a prerequisite the host lacks, with the command that
// installs it.
type MissingError struct {
	What, Hint string
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("missing prerequisite: %s (install: %s)", e.What, e.Hint)
}

const (
	guestMAC = qemu.DefaultMAC
	guestMem = "256M"
	// Checks the agent runs, in order: link up, DHCP from vunet, then the page.
	checkTimeout = "30s"
)

// demo holds one run's state; its fields are filled step by step.
type demo struct {
	cfg   Config
	start time.Time
	dir   string
	rep   Report

	vunetBin  string
	vunetLog  *qemu.LogSink
	vunetFile string
	vunet     *process
	metrics   string // host:port
	web       *webServer
	qemu      *process
	qemuErr   string // QEMU's stderr file
	console   string
	results   string
}

// Run runs the demo once. It returns what it saw, or an error saying what
// went wrong; either way every process it started has ended when it returns.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Out == nil {
		cfg.Out = os.Stdout
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 90 * time.Second
	}
	if cfg.BuildTimeout == 0 {
		cfg.BuildTimeout = 5 * time.Minute
	}
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	d := &demo{cfg: cfg, start: time.Now()}
	err := d.run(ctx)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w: the demo was interrupted", err)
	}
	d.cleanup(err)
	d.rep.Took = time.Since(d.start)
	return &d.rep, err
}

// say prints one progress line, stamped with the time since the start.
func (d *demo) say(format string, args ...any) {
	fmt.Fprintf(d.cfg.Out, "[%5.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

// detail prints an indented line under the last progress line.
func (d *demo) detail(format string, args ...any) {
	fmt.Fprintf(d.cfg.Out, "         %s\n", fmt.Sprintf(format, args...))
}

func (d *demo) run(ctx context.Context) error {
	fmt.Fprintln(d.cfg.Out, "vunet demo: a QEMU guest on vunet fetches a page from a web server on this host's loopback")
	fmt.Fprintln(d.cfg.Out)
	qemuBin, err := exec.LookPath(d.cfg.QEMU)
	if err != nil {
		return &MissingError{What: d.cfg.QEMU, Hint: qemu.QEMUHint}
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return &MissingError{What: "the go tool (vunet and the guest agent are built from source)", Hint: "https://go.dev/doc/install"}
	}
	root, err := initramfs.ModuleRoot()
	if err != nil {
		return fmt.Errorf("find the source tree: %w", err)
	}
	if d.dir, err = os.MkdirTemp("", "vunet-demo-"); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	d.rep.WorkDir = d.dir

	bctx, bcancel := context.WithTimeout(ctx, d.cfg.BuildTimeout)
	defer bcancel()
	if err := d.buildVunet(bctx, goTool, root); err != nil {
		return timeLimit(bctx, err, "building", d.cfg.BuildTimeout)
	}
	img, err := d.buildImage(bctx)
	if err != nil {
		return timeLimit(bctx, err, "building", d.cfg.BuildTimeout)
	}
	d.rep.BuildTook = time.Since(d.start)
	runStart := time.Now()
	defer func() { d.rep.RunTook = time.Since(runStart) }()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	if err := d.runGuest(ctx, qemuBin, img); err != nil {
		return timeLimit(ctx, err, "the demo", d.cfg.Timeout)
	}
	return nil
}

// timeLimit says so when err came from running out of time.
func timeLimit(ctx context.Context, err error, what string, limit time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %s ran out of time (limit %v)", err, what, limit)
	}
	return err
}

// runGuest is the demo proper: server, vunet, guest, counters.
func (d *demo) runGuest(ctx context.Context, qemu string, img initramfs.Image) error {
	var err error
	if d.web, err = startWebServer(); err != nil {
		return err
	}
	d.rep.PageSHA = d.web.sha256
	d.say("web server on http://127.0.0.1:%d%s (loopback only; %d bytes, sha256 %.12s…)", d.web.port, pagePath, len(d.web.page), d.web.sha256)
	if err := d.startVunet(ctx); err != nil {
		return err
	}
	if err := d.bootGuest(ctx, qemu, img); err != nil {
		return err
	}
	if err := d.watchGuest(ctx); err != nil {
		return err
	}
	if err := d.checkServer(); err != nil {
		return err
	}
	if err := d.showMetrics(ctx); err != nil {
		return err
	}
	d.say("stopping vunet")
	if err := d.vunet.stop(5 * time.Second); err != nil {
		return fmt.Errorf("vunet did not exit cleanly on SIGTERM: %w", err)
	}
	return d.checkRefusals()
}

// checkRefusals fails the demo if vunet's seccomp allow-list refused a
// system call: vunet needed one the list lacks.
func (d *demo) checkRefusals() error {
	if r := d.vunetLog.Match(qemu.MsgIs(qemu.SandboxRefusal)); len(r) > 0 {
		return fmt.Errorf("vunet's sandbox refused system call %s: its allow-list lacks a call vunet needs", r[0].Attr("syscall"))
	}
	return nil
}

// describeSandbox says how vunet confined itself after start-up (README
// "Security").
func (d *demo) describeSandbox() {
	for _, msg := range []string{"sandbox applied", "sandbox applied in part"} {
		if l := d.vunetLog.Match(qemu.MsgIs(msg)); len(l) > 0 {
			d.detail("vunet confined itself after start-up: user %s (uid %s), no capabilities, Landlock ABI %s, seccomp allow-list of %s system calls",
				l[0].Attr("user"), l[0].Attr("uid"), l[0].Attr("landlock_abi"), l[0].Attr("seccomp_allowed_syscalls"))
			if na := l[0].Attr("not_applied"); na != "" {
				d.detail("not applied (an unprivileged start): %s", na)
			}
			return
		}
	}
}

func (d *demo) buildVunet(ctx context.Context, goTool, root string) error {
	d.say("building vunet (go build ./cmd/vunet)")
	t0 := time.Now()
	d.vunetBin = filepath.Join(d.dir, "vunet")
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", d.vunetBin, "./cmd/vunet")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/vunet: %w\n%s", err, out)
	}
	d.detail("done in %v", time.Since(t0).Round(100*time.Millisecond))
	return nil
}

func (d *demo) buildImage(ctx context.Context) (initramfs.Image, error) {
	d.say("building the guest image (host kernel + busybox initramfs + test agent)")
	t0 := time.Now()
	img, err := initramfs.Build(ctx, initramfs.Options{})
	if errors.Is(err, initramfs.ErrMissing) {
		return img, &MissingError{What: err.Error(), Hint: "apt-get install linux-image-amd64 busybox-static"}
	}
	if err != nil {
		return img, fmt.Errorf("guest image: %w", err)
	}
	how := "built"
	if img.Cached {
		how = "from cache"
	}
	d.detail("kernel %s, %s in %v", img.KernelVersion, how, time.Since(t0).Round(100*time.Millisecond))
	return img, nil
}

func (d *demo) startVunet(ctx context.Context) error {
	socket := filepath.Join(d.dir, "vunet.sock")
	d.vunetFile = filepath.Join(d.dir, "vunet.log")
	logFile, err := os.Create(d.vunetFile)
	if err != nil {
		return fmt.Errorf("vunet log: %w", err)
	}
	var tee io.Writer = logFile
	if d.cfg.Verbose {
		tee = io.MultiWriter(logFile, prefixWriter{w: d.cfg.Out, prefix: "         vunet| "})
	}
	d.vunetLog = qemu.NewLogSink()
	argv := []string{d.vunetBin, "--socket", socket, "--metrics", "127.0.0.1:0", "--log-format", "json"}
	d.say("starting vunet: %s", strings.Join(argv[1:], " "))
	d.vunet, err = startProcess("vunet", argv, logFile, func(r io.Reader) {
		d.vunetLog.Consume(r, tee)
		logFile.Close()
	})
	if err != nil {
		logFile.Close()
		return err
	}
	started, err := d.vunetLog.Wait(10*time.Second, "vunet start-up line", qemu.MsgIs("vunet starting"))
	if err != nil {
		return fmt.Errorf("vunet did not start: %w", err)
	}
	ml, err := d.vunetLog.Wait(10*time.Second, "metrics address", qemu.MsgIs("metrics listening"))
	if err != nil {
		return fmt.Errorf("vunet metrics endpoint: %w", err)
	}
	d.metrics = ml.Attr("addr")
	if _, err := d.vunetLog.Wait(10*time.Second, "vhost-user socket", qemu.MsgIs("vhost-user listening")); err != nil {
		return fmt.Errorf("vunet socket: %w", err)
	}
	d.rep.Gateway = started.Attr("gateway4")
	d.detail("vhost-user socket %s", socket)
	d.describeSandbox()
	d.detail("metrics at http://%s/metrics", d.metrics)
	source := "copied from this host's default route"
	if n := started.Attr("notes"); n != "" {
		source = "vunet's note: " + n
	}
	d.detail("guest will get %s (network %s) with gateway %s (%s)",
		started.Attr("guest4"), started.Attr("ipv4"), d.rep.Gateway, source)
	d.detail("connections to the gateway go to this host's loopback (127.0.0.1)")
	return nil
}

func (d *demo) bootGuest(ctx context.Context, qemu string, img initramfs.Image) error {
	socket := filepath.Join(d.dir, "vunet.sock")
	nicArgs, text, err := qemuArgsFromVunet(ctx, d.vunetBin, socket, guestMem, guestMAC)
	if err != nil {
		return err
	}
	d.say("QEMU arguments from `vunet qemu-args --socket %s --tcg --mem %s`:", filepath.Base(socket), guestMem)
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		d.detail("  %s", l)
	}
	if nicArgs, err = withoutOptionROM(nicArgs); err != nil {
		return err
	}
	url := fmt.Sprintf("http://%s:%d%s", d.rep.Gateway, d.web.port, pagePath)
	d.console = filepath.Join(d.dir, "console.log")
	d.results = filepath.Join(d.dir, "results.log")
	d.qemuErr = filepath.Join(d.dir, "qemu.stderr")
	cmdline := guest.KernelArgs + " " + guest.Cmdline(
		[]string{guest.CheckLink, guest.CheckDHCP, guest.CheckHTTP},
		map[string]string{guest.ParamHTTP: url, guest.ParamTimeout: checkTimeout, guest.ParamResults: "/dev/ttyS1"})
	argv := append([]string{qemu, "-accel", "tcg", "-machine", "pc", "-cpu", "max"}, nicArgs...)
	argv = append(argv,
		"-kernel", img.Kernel, "-initrd", img.Initrd, "-append", cmdline,
		"-display", "none", "-monitor", "none", "-nodefaults", "-no-user-config",
		"-serial", "file:"+d.console, "-serial", "file:"+d.results, "-no-reboot")
	errFile, err := os.Create(d.qemuErr)
	if err != nil {
		return fmt.Errorf("qemu stderr file: %w", err)
	}
	d.say("booting the guest under QEMU (TCG, no KVM: takes 5-15 s); it will fetch %s", url)
	d.qemu, err = startProcess("qemu", argv, errFile, func(r io.Reader) {
		_, _ = io.Copy(errFile, r)
		errFile.Close()
	})
	if err != nil {
		errFile.Close()
	}
	return err
}

func (d *demo) cleanup(runErr error) {
	if d.qemu != nil {
		d.qemu.kill()
	}
	if d.vunet != nil {
		d.vunet.kill()
	}
	if d.web != nil {
		d.web.close()
	}
	if d.dir == "" {
		return
	}
	if runErr != nil {
		fmt.Fprintf(d.cfg.Out, "\nFAILED after %v: %v\n", time.Since(d.start).Round(100*time.Millisecond), runErr)
		d.dumpLogs()
		fmt.Fprintf(d.cfg.Out, "work directory kept for inspection: %s\n", d.dir)
		return
	}
	if d.cfg.Keep {
		fmt.Fprintf(d.cfg.Out, "work directory kept: %s\n", d.dir)
		return
	}
	os.RemoveAll(d.dir)
	d.rep.WorkDir = ""
}

// dumpLogs prints the tails a reader needs to see why the demo failed.
func (d *demo) dumpLogs() {
	if d.vunetLog != nil {
		fmt.Fprintf(d.cfg.Out, "\n--- vunet log (last lines, %s) ---\n%s\n", d.vunetFile, d.vunetLog.Tail(25))
	}
	if d.qemuErr != "" {
		fmt.Fprintf(d.cfg.Out, "--- QEMU stderr (%s) ---\n%s\n", d.qemuErr, tailFile(d.qemuErr, 15))
		fmt.Fprintf(d.cfg.Out, "--- guest console (last lines, %s) ---\n%s\n", d.console, tailFile(d.console, 25))
		fmt.Fprintf(d.cfg.Out, "--- agent results (%s) ---\n%s\n", d.results, tailFile(d.results, 15))
	}
}

// prefixWriter prefixes every line written to it (Write gets whole lines
// from LogSink.Consume).
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	for _, l := range bytes.SplitAfter(b, []byte("\n")) {
		if len(l) > 0 {
			fmt.Fprintf(p.w, "%s%s", p.prefix, l)
		}
	}
	return len(b), nil
}

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// scrape fetches and parses vunet's metrics once.
func (d *demo) scrape(ctx context.Context) (qemu.Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.metrics+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape metrics: %s", resp.Status)
	}
	return qemu.ParseMetrics(resp.Body)
}

// humanBytes renders a byte count for people.
func humanBytes(v float64) string {
	switch {
	case v >= 1<<20:
		return strconv.FormatFloat(v/(1<<20), 'f', 1, 64) + " MiB"
	case v >= 1<<10:
		return strconv.FormatFloat(v/(1<<10), 'f', 1, 64) + " KiB"
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + " B"
}

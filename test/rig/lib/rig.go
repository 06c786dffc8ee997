package rig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/frontend"
)

// Rig is one running rig. Its methods are safe for concurrent use.
type Rig struct {
	opts Options
	name string // vunet-rig-<pid>-<n>
	dir  string // work directory: socket, logs, scripts

	guestNS, hostNS string
	socket          string

	backend *proc
	fe      *frontend.Frontend
	tap     int
	br      *bridge
	stats   Stats

	// The rig alone (Options.Loopback): the peer's TAP and bridge, the
	// copying device in place of a back-end, and the memory and rings the
	// rig made itself.
	tap2  int
	br2   *bridge
	dev   *crossDevice
	mem   *frontend.Memory
	rings []*frontend.Ring

	// FrontendTestpmd: testpmd in place of the rig's front-end.
	testpmd          *proc
	restoreHugepages func()

	guestAddr netip.Prefix
	gateway   netip.Addr
	mtu       int

	mu       sync.Mutex
	procs    []*proc
	closed   bool
	closeErr error
}

var rigSeq atomic.Uint32

// Start brings a rig up: namespaces, back-end, vhost-user negotiation, TAP,
// bridge, guest addressing. On error everything created so far is torn
// down. The rig lives until Close (or SIGINT/SIGTERM of this process).
func Start(ctx context.Context, opts Options) (_ *Rig, err error) {
	opts = opts.withDefaults()
	if opts.Frontend == FrontendTestpmd && opts.MTU > testpmdMTU {
		return nil, fmt.Errorf("rig: testpmd's 2 KiB mbufs carry MTU %d at most, not %d", testpmdMTU, opts.MTU)
	}
	if opts.NoHostNetns && len(opts.HostSysctls) > 0 {
		return nil, errors.New("rig: HostSysctls need the host namespace (NoHostNetns is set)")
	}
	if opts.QueuePairs > maxRigPairs || opts.QueuePairs > 1 && (opts.Loopback || opts.Frontend != FrontendRig) {
		return nil, fmt.Errorf("rig: %d queue pairs: up to %d, with the rig's own front-end and a back-end", opts.QueuePairs, maxRigPairs)
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := Sweep(); err != nil {
		opts.Log.Warn("sweep of stale rigs", "err", err)
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	name := fmt.Sprintf("%s%d-%d", namePrefix, os.Getpid(), rigSeq.Add(1))
	r := &Rig{opts: opts, name: name, tap: -1, tap2: -1, guestNS: name + "-guest"}
	register(r)
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	if r.dir, err = os.MkdirTemp("", name+"-"); err != nil {
		return nil, err
	}
	r.socket = filepath.Join(r.dir, "vhost.sock")

	if err := r.setUpNamespaces(); err != nil {
		return nil, err
	}
	if opts.Loopback {
		if err := r.startLoopback(); err != nil {
			return nil, err
		}
		opts.Log.Info("rig alone up", "name", name, "guest_netns", r.guestNS, "peer_netns", r.hostNS,
			"guest", r.guestAddr, "peer", r.gateway, "mtu", r.mtu)
		return r, nil
	}
	if err := r.startBackend(); err != nil {
		return nil, err
	}
	switch opts.Frontend {
	case FrontendTestpmd:
		if err := r.startTestpmd(ctx); err != nil {
			return nil, err
		}
	case FrontendRig:
		if err := r.connect(ctx); err != nil {
			return nil, err
		}
		if err := r.startBridge(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("rig: unknown front-end %q", opts.Frontend)
	}
	if err := r.configureGuest(ctx); err != nil {
		return nil, err
	}
	opts.Log.Info("rig up", "name", name, "guest_netns", r.guestNS, "host_netns", r.hostNS,
		"guest", r.guestAddr, "gateway", r.gateway, "mtu", r.mtu, "backend_pid", r.BackendPID(),
		"frontend", opts.Frontend, "features", fmt.Sprintf("%#x", r.Features()))
	return r, nil
}

func (r *Rig) setUpNamespaces() error {
	o := r.opts
	if err := addNetns(r.guestNS); err != nil {
		return err
	}
	if err := ip("-n", r.guestNS, "link", "set", "lo", "up"); err != nil {
		return err
	}
	if err := setSysctls(r.guestNS, o.GuestSysctls); err != nil {
		return err
	}
	if o.NoHostNetns {
		return nil
	}
	if o.Loopback {
		r.hostNS = r.name + "-peer"
		if err := addNetns(r.hostNS); err != nil {
			return err
		}
		if err := ip("-n", r.hostNS, "link", "set", "lo", "up"); err != nil {
			return err
		}
		return setSysctls(r.hostNS, o.HostSysctls)
	}
	r.hostNS = r.name + "-host"
	if err := addNetns(r.hostNS); err != nil {
		return err
	}
	h := []string{"-n", r.hostNS}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		// A veth pair with both ends here: this kernel may lack the dummy
		// driver, and the route needs a link with carrier.
		{"link", "add", "rig0", "type", "veth", "peer", "name", "rig0p"},
		{"addr", "add", o.HostAddr.String(), "dev", "rig0"},
		{"link", "set", "rig0p", "up"},
		{"link", "set", "rig0", "up"},
		{"route", "add", "default", "via", o.HostGateway.String(), "dev", "rig0"},
	} {
		if err := ip(append(h, args...)...); err != nil {
			return err
		}
	}
	return setSysctls(r.hostNS, o.HostSysctls)
}

func (r *Rig) startBackend() error {
	vars := map[string]string{"socket": r.socket, "metrics": r.opts.MetricsAddr, "mtu": strconv.Itoa(r.opts.MTU)}
	for _, a := range r.opts.Backend {
		if strings.Contains(a, "{vunet}") {
			bin, err := VunetBinary()
			if err != nil {
				return err
			}
			vars["vunet"] = bin
			break
		}
	}
	argv := expand(r.opts.Backend, vars)
	p, err := startProc(r.hostNS, argv, r.opts.BackendEnv, r.BackendLog())
	if err != nil {
		return fmt.Errorf("back-end: %w", err)
	}
	r.backend = p
	r.opts.Log.Info("back-end started", "pid", p.pid(), "argv", argv)
	return nil
}

// connect dials the back-end's socket until it listens (a probe connection
// would count as the one front-end of a --one-off back-end, so the first
// successful dial is the session) and negotiates.
func (r *Rig) connect(ctx context.Context) error {
	var fe *frontend.Frontend
	for {
		var err error
		fe, err = frontend.Dial(r.socket)
		if err == nil {
			break
		}
		if r.backend.exited() {
			return fmt.Errorf("back-end exited before listening (%v); log %s:\n%s", r.backend.err, r.BackendLog(), tail(r.BackendLog(), 20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("back-end socket %s: %w (last: %v)", r.socket, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	r.fe = fe
	mask := r.opts.FeatureMask
	if mask == 0 {
		mask = frontend.DefaultFeatureMask | supportedOffloads()
	}
	// Rings, headers and buffers of both directions in one memfd.
	mem := uint64(r.opts.QueuePairs)*uint64(r.opts.RXRingSize+r.opts.TXRingSize)*uint64(r.opts.BufSize) + 4<<20
	err := fe.Negotiate(frontend.Options{
		QueuePairs:  r.opts.QueuePairs,
		RXRingSize:  r.opts.RXRingSize,
		TXRingSize:  r.opts.TXRingSize,
		FeatureMask: mask,
		MemSize:     mem,
		MTU:         r.opts.MTU,
	})
	if err != nil {
		return fmt.Errorf("negotiate with the back-end: %w", err)
	}
	return nil
}

func (r *Rig) startBridge() error {
	o := r.opts
	if len(r.fe.Pairs) < o.QueuePairs {
		return fmt.Errorf("rig: %d queue pairs negotiated, %d asked", len(r.fe.Pairs), o.QueuePairs)
	}
	var tx, rx []*frontend.FixedRing
	for _, p := range r.fe.Pairs[:o.QueuePairs] {
		t, err := p.TX.Fixed(o.BufSize, false)
		if err != nil {
			return err
		}
		x, err := p.RX.Fixed(o.BufSize, true)
		if err != nil {
			return err
		}
		tx, rx = append(tx, t), append(rx, x)
	}
	hdrLen := frontend.NetHdrLen(r.fe.Features)
	var err error
	if r.tap < 0 { // a reconnect keeps the guest's interface
		if r.tap, err = openTAP(r.guestNS, hdrLen, tunOffloads(r.fe.Features)); err != nil {
			return err
		}
		// Up before the bridge runs: a TAP that is down refuses writes
		// (EIO), and the back-end may send early frames.
		if err := ip("-n", r.guestNS, "link", "set", tapName, "up"); err != nil {
			return err
		}
	}
	r.br, err = newBridge(bridgeConfig{tap: r.tap, hdrLen: hdrLen, mrg: r.fe.Has(frontend.FeatMrgRxbuf),
		tx: tx, rx: rx, slowRX: o.SlowRX, rotate: o.TXRotate, eager: o.TXRotateEager,
		impair: o.Impair, seed: 1, observe: o.RXObserve, observeHdr: o.RXObserveHdr, stats: &r.stats, log: o.Log})
	if err != nil {
		return err
	}
	r.br.start()
	return nil
}

// Name is the rig's unique name (the namespaces' common prefix).
func (r *Rig) Name() string { return r.name }

// Dir is the rig's work directory (socket, logs, scripts).
func (r *Rig) Dir() string { return r.dir }

// GuestNetns is the guest namespace's name (ip netns exec NAME …).
func (r *Rig) GuestNetns() string { return r.guestNS }

// HostNetns is the back-end's namespace ("" with NoHostNetns).
func (r *Rig) HostNetns() string { return r.hostNS }

// Socket is the vhost-user socket path.
func (r *Rig) Socket() string { return r.socket }

// BackendLog is the file the back-end's stdout and stderr go to.
func (r *Rig) BackendLog() string { return filepath.Join(r.dir, "backend.log") }

// refusedCall finds vunet's "sandbox refused a system call" log line, in
// its text or JSON form, and the call's name.
var refusedCall = regexp.MustCompile(`"?msg"?[=:]"sandbox refused a system call".*?"?syscall"?[=:]"?([a-z0-9_#]+)`)

// sandboxRefusals lists the system calls a vunet back-end's log says its
// seccomp allow-list refused.
func sandboxRefusals(logPath string) []string {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return nil
	}
	var calls []string
	for _, m := range refusedCall.FindAllStringSubmatch(string(b), -1) {
		calls = append(calls, m[1])
	}
	return calls
}

// BackendPID is the back-end's process id (0 before it started).
func (r *Rig) BackendPID() int {
	if r.backend == nil {
		return 0
	}
	return r.backend.pid()
}

// BackendExited reports whether the back-end process is gone.
func (r *Rig) BackendExited() bool { return r.backend != nil && r.backend.exited() }

// GuestAddr is the guest's address and prefix (from DHCP or static).
func (r *Rig) GuestAddr() netip.Prefix { return r.guestAddr }

// Gateway is the guest's default gateway: host peers on the back-end
// namespace's loopback are reached through it.
func (r *Rig) Gateway() netip.Addr { return r.gateway }

// MTU is the guest interface's MTU.
func (r *Rig) MTU() int { return r.mtu }

// Features are the virtio features negotiated with the back-end (in the
// rig-alone mode, those its rings stand for; 0 when testpmd negotiated).
func (r *Rig) Features() uint64 {
	switch {
	case r.opts.Loopback:
		return loopbackFeatures()
	case r.fe == nil:
		return 0
	}
	return r.fe.Features
}

// Stats are the bridge's counters.
func (r *Rig) Stats() *Stats { return &r.stats }

// Err reports a data-path failure (a bridge stopped), nil while healthy.
func (r *Rig) Err() error {
	for _, b := range []*bridge{r.br, r.br2} {
		if b == nil {
			continue
		}
		if err := b.failed(); err != nil {
			return err
		}
	}
	if r.dev != nil {
		r.dev.errMu.Lock()
		defer r.dev.errMu.Unlock()
		return r.dev.err
	}
	return nil
}

// Close tears everything down in order: host and guest processes, the
// bridge, the vhost-user session (a --one-off back-end exits), the
// back-end, the TAP, the namespaces and the work directory. It is
// idempotent and returns the first error met (a back-end that needed a
// signal to exit counts as one).
func (r *Rig) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return r.closeErr
	}
	r.closed = true
	procs := r.procs
	r.procs = nil
	r.mu.Unlock()
	defer unregister(r)

	var errs []error
	for _, p := range procs {
		p.kill()
	}
	if err := r.stopTestpmd(5 * time.Second); err != nil {
		errs = append(errs, err)
	}
	if r.restoreHugepages != nil {
		r.restoreHugepages()
	}
	for _, b := range []*bridge{r.br, r.br2} {
		if b != nil {
			if err := b.close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if r.dev != nil {
		if err := r.dev.close(); err != nil {
			errs = append(errs, fmt.Errorf("cross device: %w", err))
		}
	}
	for _, rg := range r.rings {
		rg.Close()
	}
	if r.mem != nil {
		r.mem.Close()
	}
	if r.fe != nil {
		r.fe.Close()
	}
	if r.backend != nil {
		if err := r.backend.stop(3 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("back-end pid %d: %w", r.backend.pid(), err))
		}
		if calls := sandboxRefusals(r.BackendLog()); len(calls) > 0 {
			errs = append(errs, fmt.Errorf("back-end's sandbox refused system calls %s: vunet's allow-list lacks what it needed (cmd/vunet/isolation)", strings.Join(calls, ",")))
		}
	}
	for _, fd := range []*int{&r.tap, &r.tap2} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	for _, ns := range []string{r.guestNS, r.hostNS} {
		if ns == "" {
			continue
		}
		killNetnsPids(ns)
		if err := delNetns(ns); err != nil {
			errs = append(errs, err)
		}
	}
	if r.dir != "" && os.Getenv("VUNET_RIG_KEEP") == "" {
		os.RemoveAll(r.dir)
	}
	r.mu.Lock()
	r.closeErr = errors.Join(errs...)
	r.mu.Unlock()
	return r.closeErr
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// RingState describes both rings' indices and notification fields, for
// diagnosing a stalled data path.
func (r *Rig) RingState() string {
	if r.fe == nil || r.fe.Pair0() == nil {
		return "no rings"
	}
	p := r.fe.Pair0()
	var b strings.Builder
	for _, rg := range []*frontend.Ring{p.RX, p.TX} {
		fmt.Fprintf(&b, "ring %d: avail.idx %d used.idx %d last_used %d used.flags %#x avail_event %d kicks %d suppressed %d interrupts %d; ",
			rg.Index, rg.AvailIdx(), rg.UsedIdx(), rg.LastUsed(), rg.UsedFlags(), rg.AvailEvent(), rg.Kicks, rg.KicksSuppressed, rg.Interrupts)
	}
	return b.String()
}

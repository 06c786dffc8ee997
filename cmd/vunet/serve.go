package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"vunet/cmd/vunet/control"
	"vunet/cmd/vunet/pcap"
	"vunet/cmd/vunet/pidfile"
	"vunet/cmd/vunet/portspec"
	"vunet/metrics"
	"vunet/tcpstack"
	"vunet/tcpstack/dgram"
	"vunet/vhostuser"
	"vunet/virtqueue"
)

// shutdownGrace bounds the time from SIGTERM to exit: supervisors (systemd,
// libvirt, KubeVirt) expect a back-end to be gone promptly, and a stuck
// front-end must not keep the socket and pid file around.
const shutdownGrace = 1500 * time.Millisecond

// serve wires the data plane to the control plane and runs until ctx ends
// (signal) or, with --one-off, until the front-end leaves. st is told when
// the front-end can connect: everything before that is start-up, and its
// errors are the launcher's exit status in the background.
func serve(ctx context.Context, o *options, logger *slog.Logger, stdout io.Writer, st *startup) error {
	activated, err := socketActivation(o)
	if err != nil {
		return err
	}
	if activated != nil {
		defer activated.Close()
	}
	sc, err := buildStackConfig(o)
	if err != nil {
		return err
	}
	sc.cfg.Logger = logger
	if o.pcap != "" {
		// Closed after the stack (defers run last-in first-out): no loop
		// captures any more when the rings are written out.
		w, err := pcap.Create(o.pcap, pcap.Config{Pairs: o.queues})
		if err != nil {
			return fmt.Errorf("--pcap: %w", err)
		}
		defer func() {
			if err := w.Close(); err != nil {
				logger.Error("pcap capture", "file", o.pcap, "err", err)
			}
		}()
		sc.cfg.Capture = w
	}
	stack, err := openStack(o, sc)
	if err != nil {
		return err
	}
	defer stack.Close()
	if err := setUpMigration(ctx, o, stack, logger); err != nil {
		return err
	}

	dev := vhostuser.DeviceConfig{
		QueuePairs: o.queues,
		DataPlane:  stack,
		Logger:     logger,
		Stats:      &vhostuser.Stats{},
		MaxMemory:  uint64(o.maxGuestMemory),
	}
	if o.metrics != "" {
		ln, err := metrics.Listen(o.metrics)
		if err != nil {
			return err
		}
		a := &sc.cfg.Addr
		reg := metrics.NewRegistry(metrics.Sources{QueuePairs: o.queues, Control: dev.Stats,
			PairStats: stack.PairStats, PairTCPStats: stack.PairTCPStats, Forwards: stack.ForwardStats(),
			DNSForward: a.DNSForward4.IsValid() || a.DNSForward6.IsValid(), Build: buildInfo()})
		go func() {
			if err := metrics.Serve(ctx, ln, reg, logger); err != nil {
				logger.Error("metrics server stopped", "err", err)
			}
		}()
	}

	ready := func() {
		st.ready()
		if st.err != nil {
			logger.Warn("start-up notification failed", "err", st.err)
		}
	}
	// The socket (vhost-user's or the stream transport's) is bound before
	// the sandbox: its directory may be one the dropped user cannot write.
	var listener *vhostuser.Listener
	if o.socket != "" {
		listener, err = vhostuser.Listen(vhostuser.ServerConfig{Path: o.socket, Mode: o.socketMode, OneOff: o.oneOff, Ready: ready, Listener: activated})
		if err != nil {
			return err
		}
		defer listener.Close()
	}
	var ctlSrv *control.Server
	if o.control != "" {
		// Made before the sandbox too, for the same reason.
		if ctlSrv, err = startControl(ctx, o, sc, stack, logger); err != nil {
			return err
		}
		defer ctlSrv.Close()
	}
	if o.pidFile != "" {
		if err := pidfile.Write(o.pidFile, os.Getpid()); err != nil {
			return err
		}
	}
	if err := st.prepare(); err != nil {
		return err
	}
	sb, err := startSandbox(o, sc, logger, activated != nil, st.closedFDs)
	if err != nil {
		if o.pidFile != "" {
			os.Remove(o.pidFile)
		}
		return err
	}
	defer func() {
		if err := sb.Close(); err != nil {
			logger.Warn("vunet stopping", "err", err)
		}
	}()
	if listener != nil && sb.RemovesFiles() {
		listener.LeaveFile()
	}
	if ctlSrv != nil && sb.RemovesFiles() {
		ctlSrv.LeaveFile()
	}

	for _, w := range sc.warnings {
		logger.Warn("vunet option not enforced", "warning", w)
	}
	logger.Info("vunet starting", startupAttrs(o, sc, dev)...)
	if !sc.cfg.NoICMP {
		warnPingRefused(logger)
	}

	// Past the grace period after a signal, leave even if a session is
	// stuck, but clean up what the orderly path would have.
	stopWatch := context.AfterFunc(ctx, func() {
		time.AfterFunc(shutdownGrace, func() {
			logger.Error("shutdown took too long; exiting", "grace", shutdownGrace)
			if err := sb.Close(); err != nil {
				logger.Warn("vunet stopping", "err", err)
			}
			os.Exit(0)
		})
	})
	defer stopWatch()

	switch {
	case o.transport == transportStream:
		if o.printQEMUArgs && o.socket != "" {
			fmt.Fprintln(stdout, printedQEMUArgs(o, printedQEMU(logger)))
		}
		err = serveStreamTransport(ctx, o, listener, stack, logger, ready)
	case o.socket != "":
		if o.printQEMUArgs {
			fmt.Fprintln(stdout, printedQEMUArgs(o, printedQEMU(logger)))
		}
		err = listener.Serve(ctx, dev)
	case o.connect != "":
		// The client dials on its own time, and redials: start-up is
		// complete before the first attempt.
		ready()
		err = vhostuser.ConnectWith(ctx, o.connect, sb.Dial, dev)
		if errors.Is(err, context.Canceled) {
			err = nil
		}
	default:
		err = serveFD(ctx, o.fd, dev, ready)
	}
	if ctx.Err() != nil {
		logger.Info("vunet stopping on signal; host TCP connections are reset")
	}
	return err
}

// printedQEMUArgs is --print-qemu-args' line for the socket o serves:
// what `vunet qemu-args --tcg` prints for it (the helper's defaults: 1G,
// ids vunet0), on one line.
func printedQEMUArgs(o *options, v qemuVersion) string {
	hc := helperConfig{socket: o.socket, queues: o.queues, mem: "1G", id: "vunet0", tcg: true,
		stream: o.transport == transportStream, qemu: v}
	return strings.Join(qemuArgs(hc), " ")
}

// printedQEMU is the QEMU release --print-qemu-args spells for.
func printedQEMU(logger *slog.Logger) qemuVersion {
	v, err := detectQEMUVersion()
	if err != nil {
		v = fallbackQEMU
		logger.Warn("--print-qemu-args: QEMU version unknown, assuming "+v.String(), "err", err)
	}
	return v
}

// serveFD serves an inherited, connected socket (passt's --fd); ready is
// called once the socket is taken.
func serveFD(ctx context.Context, fd int, dev vhostuser.DeviceConfig, ready func()) error {
	uc, err := unixConnFromFD(fd)
	if err != nil {
		return err
	}
	ready()
	return vhostuser.ServeConn(ctx, uc, dev)
}

// unixConnFromFD takes over descriptor fd, which must be a UNIX socket
// (--fd).
func unixConnFromFD(fd int) (*net.UnixConn, error) {
	f := os.NewFile(uintptr(fd), "front-end")
	if f == nil {
		return nil, fmt.Errorf("--fd %d: not a file descriptor", fd)
	}
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("--fd %d: %w", fd, err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("--fd %d: not a UNIX socket", fd)
	}
	return uc, nil
}

// fdReserve is how many descriptors forwarded-port listeners must leave
// for the vhost-user socket, guest memory, eventfds and flows.
const fdReserve = 4096

// forwardSpec is one of -t/-u as the stack opens it.
type forwardSpec struct {
	flag     string // --tcp-ports, --udp-ports
	set      portspec.Set
	forwards []portspec.Forward
}

// addForwards puts the -t and -u forwards into the stack configuration, one
// tcpstack forward per port and family. Explicit ports must all bind; "all"
// and exclusion-only specifications bind what they can (passt's rule, the
// forward is Optional) and fail only when nothing binds. A forward without
// a bind address listens on both families unless one is disabled; its
// implicit IPv6 twin is Optional too (a host without IPv6).
func addForwards(o *options, sc *stackConfig) ([]forwardSpec, error) {
	specs := []forwardSpec{
		{"--tcp-ports", o.tcpPorts, sc.tcpForwards},
		{"--udp-ports", o.udpPorts, sc.udpForwards},
	}
	a := &sc.cfg.Addr
	// One socket per port and family: check the descriptor budget first,
	// keeping room for flows, rather than running out half way (passt
	// also refuses: "Can't open enough sockets").
	need := 0
	var lim syscall.Rlimit
	haveLim := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil
	for _, sp := range specs {
		for _, fw := range sp.forwards {
			fams := 1
			if !fw.Addr.IsValid() && !a.Disable4 && !a.Disable6 {
				fams = 2
			}
			need += fams * fw.Host.Len()
		}
		if haveLim && len(sp.forwards) > 0 && uint64(need)+fdReserve > lim.Cur {
			return nil, fmt.Errorf("%s %s: %d listening sockets needed, open-files limit is %d (keep %d for flows): raise it (ulimit -n, LimitNOFILE=) or forward fewer ports",
				sp.flag, sp.set.String(), need, lim.Cur, fdReserve)
		}
	}
	for i, sp := range specs {
		bestEffort := sp.set.Mode == portspec.ModeAll
		for j := range sp.set.Specs {
			if sp.set.Specs[j].ExcludeOnly() {
				bestEffort = true
			}
		}
		out := control.StackForwards(sp.forwards, families(sc), bestEffort)
		if i == 0 {
			sc.cfg.TCPForwards = out
		} else {
			sc.cfg.UDPForwards = out
		}
	}
	return specs, nil
}

// checkForwards reports a specification none of whose ports could be
// bound, and notes partial ones on the start-up line.
func checkForwards(specs []forwardSpec, res tcpstack.ForwardResult, sc *stackConfig) error {
	for i, sp := range specs {
		ports := res.TCPPorts
		if i == 1 {
			ports = res.UDPPorts
		}
		if len(sp.forwards) == 0 {
			continue
		}
		bound, failed := 0, 0
		for _, p := range ports {
			if p != 0 {
				bound++
			} else {
				failed++
			}
		}
		if bound == 0 {
			return fmt.Errorf("%s %s: no port could be bound", sp.flag, sp.set.String())
		}
		if failed > 0 {
			sc.notes = append(sc.notes, fmt.Sprintf("%s forwarding: %d ports bound, %d not bound (in use or not permitted)",
				strings.TrimSuffix(strings.TrimPrefix(sp.flag, "--"), "-ports"), bound, failed))
		}
	}
	return nil
}

// openStack builds the data plane with its forwarded ports open.
func openStack(o *options, sc *stackConfig) (*tcpstack.Stack, error) {
	specs, err := addForwards(o, sc)
	if err != nil {
		return nil, err
	}
	if err := fitFDLimit(o, sc, processRlimit{}); err != nil {
		return nil, err
	}
	stack, res, err := tcpstack.Open(sc.cfg)
	if err != nil {
		if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
			return nil, fmt.Errorf("port forwarding: out of file descriptors after %d ports: %w", res.Bound, err)
		}
		return nil, fmt.Errorf("port forwarding: %w", err)
	}
	if err := checkForwards(specs, res, sc); err != nil {
		stack.Close()
		return nil, err
	}
	return stack, nil
}

// startupAttrs is the one start-up log line: enough to tell from a log
// which build served which socket with which addresses and features.
func startupAttrs(o *options, sc *stackConfig, dev vhostuser.DeviceConfig) []any {
	a := &sc.cfg.Addr
	mode, sock := "server", o.socket
	switch {
	case o.connect != "":
		mode, sock = "client", o.connect
	case o.fd >= 0:
		mode, sock = "fd", fmt.Sprintf("fd:%d", o.fd)
	}
	b := buildInfo()
	attrs := []any{"version", b.Version, "revision", b.Revision, "transport", o.transport, "mode", mode, "socket", sock, "queues", o.queues}
	if o.socket != "" {
		attrs = append(attrs, "socket_mode", fmt.Sprintf("%#o", uint32(o.socketMode)), "one_off", o.oneOff)
	}
	if a.Disable4 {
		attrs = append(attrs, "ipv4", "disabled")
	} else {
		attrs = append(attrs, "ipv4", a.Prefix4().String(), "guest4", a.IPv4.Addr.String(), "gateway4", a.IPv4.Gateway.String())
	}
	if a.Disable6 {
		attrs = append(attrs, "ipv6", "disabled")
	} else {
		g := "link-local only"
		if a.IPv6.Addr.IsValid() {
			g = a.IPv6.Addr.String() + "/" + fmt.Sprint(a.IPv6.PrefixLen)
		}
		attrs = append(attrs, "ipv6", g, "router6", a.RouterLL().String())
	}
	attrs = append(attrs, "mtu", a.EffectiveMTU(), "mac", a.OurMAC.String(),
		"dns", joinAddrs(append(append([]netip.Addr(nil), a.DNS4...), a.DNS6...)),
		"map_gateway", mapGatewayAttr(&sc.cfg))
	if a.DNSForward4.IsValid() || a.DNSForward6.IsValid() {
		attrs = append(attrs, "dns_forward", joinAddrs([]netip.Addr{a.DNSForward4, a.DNSForward6}))
	}
	var svc []string
	for _, s := range []struct {
		off  bool
		name string
	}{{a.NoDHCP || a.Disable4, "dhcp"}, {a.NoDHCPv6 || a.Disable6, "dhcpv6"}, {a.NoNDP || a.Disable6, "ndp"}, {a.NoRA || a.NoNDP || a.Disable6, "ra"}} {
		if !s.off {
			svc = append(svc, s.name)
		}
	}
	attrs = append(attrs, "services", strings.Join(svc, ","))
	for _, f := range []struct {
		name string
		fws  []portspec.Forward
	}{{"tcp_forwards", sc.tcpForwards}, {"udp_forwards", sc.udpForwards}} {
		var fw []string
		for _, x := range f.fws {
			fw = append(fw, x.String())
		}
		attrs = append(attrs, f.name, strings.Join(fw, ","))
	}
	features := dev.Features
	if features == 0 {
		features = vhostuser.DefaultFeatures
	}
	if o.transport == transportStream {
		features = 0 // nothing is negotiated: QEMU's own virtio-net serves the guest
	}
	attrs = append(attrs, "features", featureNames(features), "metrics", o.metrics)
	if o.control != "" {
		attrs = append(attrs, "control", o.control)
	}
	if o.pcap != "" {
		attrs = append(attrs, "pcap", o.pcap)
	}
	if len(sc.notes) > 0 {
		// Fallbacks (no default route: link-local) belong on this line.
		attrs = append(attrs, "notes", strings.Join(sc.notes, "; "))
	}
	return attrs
}

func joinAddrs(list []netip.Addr) string {
	var s []string
	for _, a := range list {
		if a.IsValid() {
			s = append(s, a.String())
		}
	}
	return strings.Join(s, ",")
}

// featureNames spells the offered virtio feature bits for the log.
func featureNames(f uint64) string {
	names := map[int]string{
		virtqueue.FeatureNetCsum: "csum", virtqueue.FeatureNetGuestCsum: "guest_csum",
		virtqueue.FeatureNetMTU: "mtu", virtqueue.FeatureNetMAC: "mac",
		virtqueue.FeatureNetGuestTSO4: "guest_tso4", virtqueue.FeatureNetGuestTSO6: "guest_tso6",
		virtqueue.FeatureNetGuestECN: "guest_ecn", virtqueue.FeatureNetGuestUFO: "guest_ufo",
		virtqueue.FeatureNetHostTSO4: "host_tso4", virtqueue.FeatureNetHostTSO6: "host_tso6",
		virtqueue.FeatureNetHostECN: "host_ecn", virtqueue.FeatureNetHostUFO: "host_ufo",
		virtqueue.FeatureNetGuestUSO4: "guest_uso4", virtqueue.FeatureNetGuestUSO6: "guest_uso6",
		virtqueue.FeatureNetHostUSO:  "host_uso",
		virtqueue.FeatureNetMrgRxbuf: "mrg_rxbuf", virtqueue.FeatureNetStatus: "status",
		virtqueue.FeatureNetMQ: "mq", virtqueue.FeatureRingIndirectDesc: "indirect_desc",
		virtqueue.FeatureRingEventIdx: "event_idx", virtqueue.FeatureVersion1: "version_1",
		30: "protocol_features", 26: "log_all",
	}
	var out []string
	for bit := 0; bit < 64; bit++ {
		if f&(1<<bit) == 0 {
			continue
		}
		if n, ok := names[bit]; ok {
			out = append(out, n)
		} else {
			out = append(out, fmt.Sprintf("bit%d", bit))
		}
	}
	return strings.Join(out, ",")
}

// warnPingRefused says once, at start-up, that guest pings will go
// unanswered because the host refuses ping sockets; vunet keeps running.
func warnPingRefused(logger *slog.Logger) {
	v4, v6 := dgram.ProbePingSockets()
	for _, r := range []struct {
		family string
		err    error
	}{{"ipv4", v4}, {"ipv6", v6}} {
		if r.err != nil {
			logger.Warn("guest ICMP echo will go unanswered", "family", r.family, "err", r.err,
				"fix", `sysctl -w net.ipv4.ping_group_range="0 2147483647"`)
		}
	}
}

// mapGatewayAttr says for the start-up line which families' gateway
// reaches the host's loopback.
func mapGatewayAttr(c *tcpstack.Config) any {
	switch {
	case c.NoMapGateway || c.NoMapGateway4 && c.NoMapGateway6:
		return false
	case c.NoMapGateway6:
		return "ipv4 only"
	case c.NoMapGateway4:
		return "ipv6 only"
	}
	return true
}

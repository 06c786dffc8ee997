package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	rig "vunet/test/rig/lib"
)

// Ports the host peers listen on, in the host namespace.
const (
	iperfPort = 5201
	echoPort  = 5301
	idlePort  = 5302
)

// benchSysctls let the connection-rate and idle-connection tests open tens
// of thousands of connections in a few seconds on both sides: a wide
// ephemeral range (starting above the servers' ports: a back-end's
// TIME_WAIT socket on a server port would block the next listener) and
// TIME_WAIT reuse for outgoing connections, and an accept queue deep enough
// to hold every idle connection.
var benchSysctls = map[string]string{
	"net.ipv4.ip_local_port_range": "10000 65535",
	"net.ipv4.tcp_tw_reuse":        "1",
	"net.core.somaxconn":           "65535",
}

// target is one path between a "guest" namespace (clients) and a "host"
// namespace (servers): the kernel alone (a veth pair) or a vhost-user
// back-end on the rig.
type target struct {
	backend string // "kernel", "vunet" or the peer's name
	mtu     int
	guestNS string
	hostNS  string
	// serverIP is the address clients in the guest namespace dial to reach
	// servers in the host namespace; listenIP is where those servers bind.
	serverIP, listenIP string
	rig                *rig.Rig // nil for the kernel
	// alone: the rig front-end alone (no back-end); its CPU is this
	// process's, where the rig runs.
	alone   bool
	logDir  string
	procs   []*exec.Cmd
	cleanup func() error
}

// pid is the back-end's process id (0 for the kernel and the rig alone).
func (t *target) pid() int {
	if t.rig == nil {
		return 0
	}
	return t.rig.BackendPID()
}

// cpuPID is the process whose CPU time a row of t costs: the back-end's,
// this process for the rig alone (its front-end and copying device run
// here), 0 for the kernel.
func (t *target) cpuPID() int {
	if t.alone {
		return os.Getpid()
	}
	return t.pid()
}

func (t *target) inGuest(fn func() error) error { return inNetns(t.guestNS, fn) }
func (t *target) inHost(fn func() error) error  { return inNetns(t.hostNS, fn) }

// guestCommand runs argv in the guest namespace.
func (t *target) guestCommand(ctx context.Context, argv ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", t.guestNS}, argv...)...)
}

// startHost starts a long-running server in the host namespace; close kills
// it.
func (t *target) startHost(logName string, argv ...string) error {
	f, err := os.Create(filepath.Join(t.logDir, logName+".log"))
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", t.hostNS}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s in %s: %w", strings.Join(argv, " "), t.hostNS, err)
	}
	t.procs = append(t.procs, cmd)
	return nil
}

// waitListen waits until a TCP socket listens on port in the host
// namespace, without connecting to it (iperf3 would take a probe
// connection for a test).
func (t *target) waitListen(ctx context.Context, port int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", t.hostNS, "ss", "-Hltn", "sport = :"+strconv.Itoa(port)).Output()
		if err == nil && strings.TrimSpace(string(out)) != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: nothing listens on port %d in %s: %w", t.backend, port, t.hostNS, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// close kills the servers and tears the path down.
func (t *target) close() error {
	for _, c := range t.procs {
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		c.Wait()
	}
	t.procs = nil
	var err error
	if t.cleanup != nil {
		err = t.cleanup()
	}
	os.RemoveAll(t.logDir)
	return err
}

var vethSeq int

// newVethTarget builds the kernel ceiling: two namespaces joined by a veth
// pair with the given MTU. The names share the rig's prefix and this
// process's pid, so rig.Sweep removes them if this process dies.
func newVethTarget(mtu int) (*target, error) {
	vethSeq++
	base := fmt.Sprintf("vunet-rig-%d-bench%d", os.Getpid(), vethSeq)
	t := &target{backend: "kernel", mtu: mtu, hostNS: base + "-a", guestNS: base + "-b",
		serverIP: "10.214.0.1", listenIP: "10.214.0.1"}
	var err error
	if t.logDir, err = os.MkdirTemp("", base+"-"); err != nil {
		return nil, err
	}
	t.cleanup = func() error {
		var errs []error
		for _, ns := range []string{t.hostNS, t.guestNS} {
			if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
				errs = append(errs, ipCmd("netns", "del", ns))
			}
		}
		return errors.Join(errs...)
	}
	a, b := t.hostNS, t.guestNS
	m := strconv.Itoa(mtu)
	for _, args := range [][]string{
		{"netns", "add", a}, {"netns", "add", b},
		{"-n", a, "link", "add", "va", "mtu", m, "type", "veth", "peer", "name", "vb", "mtu", m, "netns", b},
		{"-n", a, "addr", "add", "10.214.0.1/24", "dev", "va"},
		{"-n", b, "addr", "add", "10.214.0.2/24", "dev", "vb"},
		{"-n", a, "link", "set", "va", "up"}, {"-n", b, "link", "set", "vb", "up"},
		{"-n", a, "link", "set", "lo", "up"}, {"-n", b, "link", "set", "lo", "up"},
	} {
		if err := ipCmd(args...); err != nil {
			t.close()
			return nil, err
		}
	}
	for _, ns := range []string{a, b} {
		if err := setSysctls(ns, benchSysctls); err != nil {
			t.close()
			return nil, err
		}
	}
	return t, nil
}

// newRigTarget starts a rig whose back-end is the command template argv.
func newRigTarget(ctx context.Context, name string, argv []string, mtu int, log *slog.Logger) (*target, error) {
	return startRigTarget(ctx, name, rig.Options{Backend: argv}, mtu, log)
}

// aloneName is the rig-alone rows' back-end column.
const aloneName = "rig-alone"

// newAloneTarget starts the rig front-end alone (rig.Options.Loopback):
// kernel ↔ rig ↔ kernel, the rig's own share of every rig row.
func newAloneTarget(ctx context.Context, mtu int, log *slog.Logger) (*target, error) {
	t, err := startRigTarget(ctx, aloneName, rig.Options{Loopback: true}, mtu, log)
	if err != nil {
		return nil, err
	}
	t.alone = true
	t.listenIP = t.serverIP // servers in the peer namespace, on its TAP's address
	return t, nil
}

func startRigTarget(ctx context.Context, name string, o rig.Options, mtu int, log *slog.Logger) (*target, error) {
	o.MTU = mtu
	o.GuestSysctls, o.HostSysctls = benchSysctls, benchSysctls
	o.Log = log
	o.StartTimeout = 30 * time.Second
	r, err := rig.Start(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("%s rig (MTU %d): %w", name, mtu, err)
	}
	t := &target{backend: name, mtu: mtu, rig: r, guestNS: r.GuestNetns(), hostNS: r.HostNetns(),
		serverIP: r.Gateway().String(), listenIP: "127.0.0.1"}
	if t.hostNS == "" {
		r.Close()
		return nil, errors.New("rig has no host namespace")
	}
	if t.logDir, err = os.MkdirTemp("", r.Name()+"-bench-"); err != nil {
		r.Close()
		return nil, err
	}
	t.cleanup = func() error {
		var errs []error
		if err := r.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%s rig data path: %w", name, err))
		}
		if err := r.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s rig close: %w", name, err))
		}
		return errors.Join(errs...)
	}
	return t, nil
}

package rig

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
)

// GuestCommand returns a command that runs name with args in the guest
// namespace (ip netns exec). The caller runs and waits for it.
func (r *Rig) GuestCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", r.guestNS, name}, args...)...)
}

// HostCommand is GuestCommand for the back-end's namespace.
func (r *Rig) HostCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	if r.hostNS == "" {
		return exec.CommandContext(ctx, name, args...)
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", r.hostNS, name}, args...)...)
}

// GuestExec runs a command in the guest namespace and returns its combined
// output; a non-zero exit is an error carrying the output.
func (r *Rig) GuestExec(ctx context.Context, name string, args ...string) ([]byte, error) {
	return run(r.GuestCommand(ctx, name, args...))
}

// HostExec runs a command in the back-end's namespace (see GuestExec).
func (r *Rig) HostExec(ctx context.Context, name string, args ...string) ([]byte, error) {
	return run(r.HostCommand(ctx, name, args...))
}

func run(cmd *exec.Cmd) ([]byte, error) {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// StartHost starts a long-running process (a host peer such as
// "iperf3 -s") in the back-end's namespace with its output in
// Dir()/<logName>.log; the rig kills it on Close. It returns the pid.
func (r *Rig) StartHost(logName string, argv ...string) (int, error) {
	return r.startTracked(r.hostNS, logName, argv)
}

// StartGuest is StartHost for the guest namespace.
func (r *Rig) StartGuest(logName string, argv ...string) (int, error) {
	return r.startTracked(r.guestNS, logName, argv)
}

func (r *Rig) startTracked(ns, logName string, argv []string) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, os.ErrClosed
	}
	p, err := startProc(ns, argv, nil, r.dir+"/"+logName+".log")
	if err != nil {
		return 0, err
	}
	r.procs = append(r.procs, p)
	return p.pid(), nil
}

// InGuest runs fn on a thread inside the guest namespace: sockets it
// creates are the guest's. fn must not start processes.
func (r *Rig) InGuest(fn func() error) error { return inNetns(r.guestNS, fn) }

// InHost runs fn inside the back-end's namespace (see InGuest).
func (r *Rig) InHost(fn func() error) error {
	if r.hostNS == "" {
		return fn()
	}
	return inNetns(r.hostNS, fn)
}

// GuestDial connects from the guest namespace, e.g.
// GuestDial(ctx, "tcp", net.JoinHostPort(r.Gateway().String(), "5201")).
func (r *Rig) GuestDial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := r.InGuest(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// HostListen listens in the back-end's namespace; a host peer on
// 127.0.0.1 there is what the guest reaches through the gateway address.
func (r *Rig) HostListen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := r.InHost(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// HostListenPacket is HostListen for datagram sockets (UDP).
func (r *Rig) HostListenPacket(network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := r.InHost(func() error {
		var err error
		c, err = net.ListenPacket(network, addr)
		return err
	})
	return c, err
}

// GuestListenPacket opens a datagram socket in the guest namespace.
func (r *Rig) GuestListenPacket(network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := r.InGuest(func() error {
		var err error
		c, err = net.ListenPacket(network, addr)
		return err
	})
	return c, err
}

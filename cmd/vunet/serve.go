package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"

	"vunet/metrics"
	"vunet/tcpstack"
	"vunet/vhostuser"
)

// dataPlane adapts tcpstack.Stack to vhostuser.DataPlane. The two packages
// must not import each other (DESIGN.md), so each declares its own copy of
// the queue-pair description and the command converts between them.
type dataPlane struct{ stack *tcpstack.Stack }

func (d dataPlane) StartPair(qp vhostuser.QueuePair) error {
	return d.stack.StartPair(tcpstack.QueuePair(qp))
}

func (d dataPlane) StopPair(index int) { d.stack.StopPair(index) }

// Announce forwards SEND_RARP so the guest's new location is announced after
// a migration.
func (d dataPlane) Announce(mac [6]byte) { d.stack.Announce(mac) }

// EndSession forwards the end of a front-end session (disconnect, device
// reset): the stack resets the guest's TCP connections and closes its flows.
func (d dataPlane) EndSession() { d.stack.EndSession() }

// SetMTU forwards NET_SET_MTU (QEMU's host_mtu property).
func (d dataPlane) SetMTU(mtu int) { d.stack.SetMTU(mtu) }

// serve wires the data plane to the control plane and runs until ctx ends
// (signal) or, with --one-off, until the front-end leaves.
func serve(ctx context.Context, o *options, logger *slog.Logger, stdout io.Writer) error {
	stack := tcpstack.New(tcpstack.Config{Logger: logger})
	defer stack.Close()
	dev := vhostuser.DeviceConfig{
		QueuePairs: o.queues,
		DataPlane:  dataPlane{stack},
		Logger:     logger,
		Stats:      &vhostuser.Stats{},
	}
	if o.metrics != "" {
		ln, err := metrics.Listen(o.metrics)
		if err != nil {
			return err
		}
		reg := metrics.NewRegistry(metrics.Sources{QueuePairs: o.queues, Control: dev.Stats, PairStats: stack.PairStats, PairTCPStats: stack.PairTCPStats})
		go func() {
			if err := metrics.Serve(ctx, ln, reg, logger); err != nil {
				logger.Error("metrics server stopped", "err", err)
			}
		}()
	}

	switch {
	case o.socket != "":
		logger.Info("vunet starting", "version", version, "mode", "server", "socket", o.socket,
			"socket_mode", fmt.Sprintf("%#o", uint32(o.socketMode)), "queues", o.queues, "one_off", o.oneOff)
		if o.printQEMUArgs {
			fmt.Fprintln(stdout, qemuArgs(o.socket, o.queues))
		}
		return vhostuser.Serve(ctx, vhostuser.ServerConfig{Path: o.socket, Mode: o.socketMode, OneOff: o.oneOff}, dev)
	case o.connect != "":
		logger.Info("vunet starting", "version", version, "mode", "client", "socket", o.connect, "queues", o.queues)
		return vhostuser.Connect(ctx, o.connect, dev)
	default:
		f := os.NewFile(uintptr(o.fd), "vhost-user")
		if f == nil {
			return fmt.Errorf("--fd %d: not a file descriptor", o.fd)
		}
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("--fd %d: %w", o.fd, err)
		}
		uc, ok := c.(*net.UnixConn)
		if !ok {
			c.Close()
			return fmt.Errorf("--fd %d: not a UNIX socket", o.fd)
		}
		logger.Info("vunet starting", "version", version, "mode", "fd", "fd", o.fd, "queues", o.queues)
		return vhostuser.ServeConn(ctx, uc, dev)
	}
}

// qemuArgs returns the QEMU command-line fragment that connects a guest to
// the socket. vectors=0 works around QEMU 7.2's TCG crash with MSI-X and
// vhost-user (FIELD-NOTES.md); it costs nothing measurable under KVM.
func qemuArgs(socket string, queues int) string {
	dev := "-device virtio-net-pci,netdev=vunet0,vectors=0"
	netdev := "-netdev vhost-user,id=vunet0,chardev=vunet0"
	if queues > 1 {
		netdev += fmt.Sprintf(",queues=%d", queues)
		dev += ",mq=on"
	}
	return fmt.Sprintf("-object memory-backend-memfd,id=mem0,size=<guest RAM>,share=on -numa node,memdev=mem0 "+
		"-chardev socket,id=vunet0,path=%s %s %s", socket, netdev, dev)
}

package main

import (
	"log/slog"
	"os"
	"strconv"
	"strings"

	"vunet/cmd/vunet/isolation"
)

// givenFDs are the descriptors the command line hands over (--fd); the
// sandbox closes every other inherited one.
func (o *options) givenFDs() []int {
	if o.fd >= 0 {
		return []int{o.fd}
	}
	return nil
}

// startSandbox confines the daemon once start-up is done (DESIGN.md
// "Isolation"): the socket, forwards, metrics listener, log, pcap and pid
// file are open. The files start-up created are removed at exit.
// activated: the socket came from systemd, which owns its file.
func startSandbox(o *options, sc *stackConfig, logger *slog.Logger, activated bool, closedFDs []int) (*isolation.Sandbox, error) {
	var remove []isolation.FileID
	var own []string
	ours := []string{o.pidFile, o.migrateTo}
	if o.repairPath != "none" {
		ours = append(ours, o.repairPath)
	}
	if o.socket != "" && !activated { // systemd's socket file is systemd's
		own = append(own, o.socket)
		ours = append(ours, o.socket)
	}
	if o.control != "" {
		ours = append(ours, o.control)
		// Whoever may connect may change the forwards: the file stays
		// the starting user's unless --runas names whom the daemon is
		// for (never nobody's, which every nobody process would share).
		if o.runAs != "" {
			own = append(own, o.control)
		}
	}
	for _, p := range ours {
		if p == "" {
			continue
		}
		if id, err := isolation.IdentifyFile(p); err == nil {
			remove = append(remove, id)
		}
	}
	if o.sandbox == "on" {
		warnPrivilegedUDPForwards(logger, sc)
	}
	return isolation.Apply(isolation.Config{
		Off:       o.sandbox == "off",
		RunAs:     o.runAs,
		Metrics:   o.metrics != "",
		Control:   o.control != "",
		Connect:   o.connect,
		Remove:    remove,
		Own:       own,
		ClosedFDs: closedFDs,
		Logger:    logger,
	})
}

// warnPrivilegedUDPForwards says at start-up what the sandbox costs a UDP
// forward of a port below net.ipv4.ip_unprivileged_port_start: each host
// peer's replies leave from a socket bound to the forwarded port, opened
// when the peer first sends, and after the privilege drop the kernel
// refuses that bind (TCP forwards only accept, and are not affected).
func warnPrivilegedUDPForwards(logger *slog.Logger, sc *stackConfig) {
	start := unprivilegedPortStart()
	var low []string
	seen := map[uint16]bool{}
	for _, fw := range sc.cfg.UDPForwards {
		if fw.HostPort != 0 && int(fw.HostPort) < start && !seen[fw.HostPort] {
			seen[fw.HostPort] = true
			low = append(low, strconv.Itoa(int(fw.HostPort)))
		}
	}
	if len(low) == 0 || os.Geteuid() != 0 {
		return
	}
	logger.Warn("UDP forwards below net.ipv4.ip_unprivileged_port_start cannot answer host peers from the forwarded port once the sandbox drops privileges",
		"ports", strings.Join(low, ","), "ip_unprivileged_port_start", start,
		"fix", "forward a port at or above it (-u 5353:53), lower the sysctl, or --sandbox=off")
}

// unprivilegedPortStart reads net.ipv4.ip_unprivileged_port_start (1024
// where it cannot be read).
func unprivilegedPortStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start")
	if err != nil {
		return 1024
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 1024
	}
	return n
}

// prepare opens, before the sandbox, what becoming ready needs: the
// sandbox allows no new file or UNIX socket afterwards.
func (s *startup) prepare() error {
	if s.pipe != nil {
		null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		s.null = null
	}
	if s.notify != "" {
		c, err := sdNotifyDial(s.notify)
		if err != nil {
			return err
		}
		s.notifyConn = c
	}
	return nil
}

package rig

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Frontend names the vhost-user front-end a rig runs in front of the
// back-end.
type Frontend string

const (
	// FrontendRig is the rig's own in-process front-end (the default).
	FrontendRig Frontend = ""
	// FrontendTestpmd is DPDK's testpmd: its virtio-user port is the
	// front-end and its TAP port (born in the guest namespace) the guest's
	// NIC, bridged in io forward mode. It negotiates no EVENT_IDX and no
	// offloads, busy-polls one core, carries 2 KiB mbufs (MTU 1500) and,
	// unlike a virtio guest, drops what the TX ring cannot take.
	FrontendTestpmd Frontend = "testpmd"
)

// TestpmdHint says how to get dpdk-testpmd.
const TestpmdHint = "apt-get install dpdk-dev (provides dpdk-testpmd)"

// testpmdMTU is the largest MTU testpmd's 2 KiB mbufs carry.
const testpmdMTU = 1500

// testpmdHugepages is the free 2 MiB hugepages to have before testpmd
// starts: its -m 256 reservation plus some slack.
const testpmdHugepages = 160

// TestpmdBinary is the dpdk-testpmd to run: $VUNET_E2E_TESTPMD, else the
// one on PATH.
func TestpmdBinary() (string, error) {
	if p := os.Getenv("VUNET_E2E_TESTPMD"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("dpdk-testpmd")
	if err != nil {
		return "", fmt.Errorf("dpdk-testpmd not found (%s): %w", TestpmdHint, err)
	}
	return p, nil
}

// startTestpmd runs testpmd inside the guest namespace, so that its TAP
// (named like the rig's, eth0) is born there: a TAP the PMD opened and that
// is moved to another namespace afterwards stops being read. The arguments
// follow FIELD-NOTES' recipe, the one issue reports use.
func (r *Rig) startTestpmd(ctx context.Context) error {
	bin, err := TestpmdBinary()
	if err != nil {
		return err
	}
	restore, err := EnsureHugepages(testpmdHugepages)
	if err != nil {
		return err
	}
	r.restoreHugepages = restore
	args := []string{bin,
		"-l", "0-1", "-m", "256", "--no-pci", "--in-memory", "--single-file-segments",
		"--file-prefix", r.name, "--no-telemetry", "--log-level", "lib.eal:notice",
		"--vdev", "net_virtio_user0,path=" + r.socket + ",queue_size=1024",
		"--vdev", "net_tap0,iface=" + tapName,
		"--",
		// A stats period keeps testpmd forwarding until SIGINT (without
		// one it waits for a key on stdin); the final statistics come on
		// SIGINT anyway.
		"--forward-mode=io", "--auto-start", "--stats-period", "3600", "--nb-cores", "1",
		"--total-num-mbufs", "16384",
	}
	p, err := startProc(r.guestNS, args, nil, r.TestpmdLog())
	if err != nil {
		return fmt.Errorf("testpmd: %w", err)
	}
	r.testpmd = p
	r.opts.Log.Info("testpmd started", "pid", p.pid(), "argv", args)
	for {
		if p.exited() {
			return fmt.Errorf("testpmd exited (%v); log %s:\n%s", p.err, r.TestpmdLog(), tail(r.TestpmdLog(), 20))
		}
		if _, err := readMTU(r.guestNS); err == nil && testpmdForwarding(r.TestpmdLog()) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testpmd did not start forwarding: %w; log %s:\n%s", ctx.Err(), r.TestpmdLog(), tail(r.TestpmdLog(), 20))
		case <-time.After(50 * time.Millisecond):
		}
	}
	// Up and out of the way of IPv6 autoconfiguration noise.
	if err := setSysctls(r.guestNS, map[string]string{"net.ipv6.conf." + tapName + ".disable_ipv6": "1"}); err != nil {
		return err
	}
	return ip("-n", r.guestNS, "link", "set", tapName, "up")
}

func testpmdForwarding(logPath string) bool {
	b, err := os.ReadFile(logPath)
	return err == nil && strings.Contains(string(b), "io packet forwarding")
}

// TestpmdLog is testpmd's output (FrontendTestpmd).
func (r *Rig) TestpmdLog() string { return filepath.Join(r.dir, "testpmd.log") }

// stopTestpmd asks testpmd to stop (SIGINT: it prints its final forward
// statistics and closes its ports, so the back-end sees the front-end
// leave), then kills it if it lingers.
func (r *Rig) stopTestpmd(grace time.Duration) error {
	p := r.testpmd
	if p == nil || p.exited() {
		return nil
	}
	syscall.Kill(p.pid(), syscall.SIGINT)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("testpmd ignored SIGINT for %v and was killed", grace)
}

// TestpmdPortStats are one port's counters from testpmd's "Forward
// statistics for port N" block. Port 0 is the virtio-user port (TX: frames
// put on the back-end's TX ring, TX-dropped: frames the ring had no room
// for), port 1 the TAP.
type TestpmdPortStats struct {
	RXPackets, RXDropped, TXPackets, TXDropped uint64
}

var (
	fwdHeader = regexp.MustCompile(`Forward statistics for port (\d+)`)
	fwdRX     = regexp.MustCompile(`RX-packets:\s*(\d+)\s+RX-dropped:\s*(\d+)`)
	fwdTX     = regexp.MustCompile(`TX-packets:\s*(\d+)\s+TX-dropped:\s*(\d+)`)
)

// ParseTestpmdStats returns, per port number, the last forward statistics
// block in testpmd's output.
func ParseTestpmdStats(out string) map[int]TestpmdPortStats {
	stats := map[int]TestpmdPortStats{}
	port := -1
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := fwdHeader.FindStringSubmatch(line); m != nil {
			port, _ = strconv.Atoi(m[1])
			stats[port] = TestpmdPortStats{}
			continue
		}
		if port < 0 {
			continue
		}
		s := stats[port]
		if m := fwdRX.FindStringSubmatch(line); m != nil {
			s.RXPackets, _ = strconv.ParseUint(m[1], 10, 64)
			s.RXDropped, _ = strconv.ParseUint(m[2], 10, 64)
		} else if m := fwdTX.FindStringSubmatch(line); m != nil {
			s.TXPackets, _ = strconv.ParseUint(m[1], 10, 64)
			s.TXDropped, _ = strconv.ParseUint(m[2], 10, 64)
			stats[port] = s
			port = -1 // TX closes the block
			continue
		}
		stats[port] = s
	}
	return stats
}

// StopTestpmd stops a FrontendTestpmd rig's testpmd and returns its final
// forward statistics (the back-end then sees its front-end leave; a
// --one-off back-end exits). The rig is still to be closed.
func (r *Rig) StopTestpmd() (map[int]TestpmdPortStats, error) {
	if r.testpmd == nil {
		return nil, errors.New("rig: no testpmd")
	}
	err := r.stopTestpmd(10 * time.Second)
	b, rerr := os.ReadFile(r.TestpmdLog())
	if rerr != nil {
		return nil, errors.Join(err, rerr)
	}
	return ParseTestpmdStats(string(b)), err
}

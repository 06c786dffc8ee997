package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// The UDP GSO rows: the same 1472-byte datagrams at the same rate
// (-udp-rate) as the iperf3 UDP rows, but sent the way a QUIC stack sends
// them, udpGSOSegs to a UDP_SEGMENT
// send, and received with UDP_GRO (test/bench/udpgso). A back-end that
// takes and gives USO frames moves such a run as one frame; one that does
// not, as udpGSOSegs frames, which the kernel on the far side may or may
// not coalesce again.

// udpGSOPort is where the udpgso server listens in the host namespace.
const udpGSOPort = 5202

// udpGSOSegs is the datagrams of one send: 44 × 1472 bytes fit one IPv4
// packet's 64 KiB.
const udpGSOSegs = 44

// buildUDPGSO builds test/bench/udpgso from the tree at root into dir.
func buildUDPGSO(root, dir string) (string, error) {
	bin := filepath.Join(dir, "udpgso")
	cmd := exec.Command("go", "build", "-o", bin, "./test/bench/udpgso")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./test/bench/udpgso: %w\n%s", err, out)
	}
	return bin, nil
}

// udpGSORows runs the UDP GSO rows of one round on every target, both
// ways, with a udpgso server in each host namespace.
func (r *runner) udpGSORows(ctx context.Context, ts []*target, mtu int) {
	if r.udpgso == "" {
		return
	}
	for _, t := range ts {
		listen := net.JoinHostPort(t.listenIP, strconv.Itoa(udpGSOPort))
		if err := t.startHost("udpgso", r.udpgso, "serve", "-listen", listen); err != nil {
			r.note("%s: udpgso server: %v", t.backend, err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the servers bind
	for _, dir := range []struct {
		name, arrow string
		reverse     bool
	}{{"guest_to_host", "guest→host", false}, {"host_to_guest", "host→guest", true}} {
		label := fmt.Sprintf("UDP GSO %s %dB×%d MTU %d", dir.arrow, udpLen, udpGSOSegs, mtu)
		for _, t := range ts {
			r.add(r.measureUDPGSO(ctx, t, label, dir.name, dir.reverse))
		}
	}
}

// measureUDPGSO runs one udpgso client in t's guest namespace and returns
// its row.
func (r *runner) measureUDPGSO(ctx context.Context, t *target, label, dir string, reverse bool) Result {
	row := Result{Test: "udp_gso_throughput", Label: label, Backend: t.backend, Direction: dir, MTU: t.mtu,
		Streams: 1, Unit: "Gbit/s", HigherIsBetter: true}
	mode := "send"
	if reverse {
		mode = "recv"
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(r.s.seconds)*time.Second+20*time.Second)
	defer cancel()
	var out []byte
	var err error
	before := probeLoss(ctx, t)
	cpu, cerr := cpuDuring(t.cpuPID(), func() {
		out, err = t.guestCommand(ctx, r.udpgso, mode, "-to", net.JoinHostPort(t.serverIP, strconv.Itoa(udpGSOPort)),
			"-t", strconv.Itoa(r.s.seconds), "-len", strconv.Itoa(udpLen), "-segs", strconv.Itoa(udpGSOSegs), "-b", r.s.udpRate).Output()
	})
	if cerr != nil {
		row.Error = cerr.Error()
		return row
	}
	if err != nil {
		row.Error = fmt.Sprintf("udpgso %s: %v: %s", mode, err, firstLine(out, err))
		return row
	}
	var res struct {
		Sent, Received, Bytes int64
		Seconds               float64
	}
	if err := json.Unmarshal(out, &res); err != nil || res.Seconds <= 0 || res.Sent <= 0 {
		row.Error = fmt.Sprintf("udpgso %s output %q: %v", mode, out, err)
		return row
	}
	row.Value, row.Bytes = float64(res.Bytes)*8/res.Seconds/1e9, res.Bytes
	loss := 100 * float64(res.Sent-res.Received) / float64(res.Sent)
	row.LossPercent = ptr(loss)
	if t.cpuPID() > 0 && res.Bytes > 0 {
		row.CPUSecPerGB = ptr(cpu / (float64(res.Bytes) / 1e9))
		row.BackendBusy = ptr(cpu / res.Seconds)
	}
	row.Note = fmt.Sprintf("sent %s Gbit/s, loss %.1f%%", num(float64(res.Sent*udpLen)*8/res.Seconds/1e9), loss)
	if n := lossNote(before, probeLoss(ctx, t)); n != "" {
		row.Note += "; " + n
	}
	if t.alone {
		row.Note += "; CPU: the rig itself (this process)"
	}
	return row
}

// udpGSODir is a fresh directory for the udpgso binary.
func udpGSODir() (string, error) { return os.MkdirTemp("", "vunet-bench-udpgso-") }

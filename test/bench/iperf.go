package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"time"
)

// iperfOut is the part of iperf3 -J output the benchmark reads.
type iperfOut struct {
	Error string `json:"error"`
	End   struct {
		SumSent     iperfSum `json:"sum_sent"`
		SumReceived iperfSum `json:"sum_received"`
		Sum         iperfSum `json:"sum"` // UDP
	} `json:"end"`
}

type iperfSum struct {
	Seconds       float64 `json:"seconds"`
	Bytes         int64   `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Packets       int64   `json:"packets"`
	LostPackets   int64   `json:"lost_packets"`
	LostPercent   float64 `json:"lost_percent"`
}

// iperfSpec is one iperf3 client run in the guest namespace.
type iperfSpec struct {
	seconds int
	streams int
	reverse bool   // host→guest: the server sends
	udp     bool   // UDP with udpLen-byte payloads at udpRate
	udpRate string // iperf3 -b
}

const udpLen = 1472

// iperfResult is what one run moved.
type iperfResult struct {
	gbits       float64 // received rate
	sentGbits   float64
	bytes       int64 // received
	lossPercent float64
	cpu         float64 // back-end CPU seconds during the run (0 for the kernel)
	seconds     float64 // the run's measured duration
}

// runIperf runs the iperf3 client in t's guest namespace against the server
// in its host namespace, with the back-end's CPU time read around it.
func runIperf(ctx context.Context, t *target, s iperfSpec) (iperfResult, error) {
	var res iperfResult
	args := []string{"iperf3", "-c", t.serverIP, "-p", strconv.Itoa(iperfPort),
		"-t", strconv.Itoa(s.seconds), "-P", strconv.Itoa(s.streams), "-J",
		// A back-end that stalls ends the run in seconds, not minutes.
		"--connect-timeout", "3000"}
	if s.reverse {
		args = append(args, "-R", "--rcv-timeout", "5000") // receiving side only
	}
	if s.udp {
		args = append(args, "-u", "-b", s.udpRate, "-l", strconv.Itoa(udpLen))
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(s.seconds)*time.Second+15*time.Second)
	defer cancel()
	var out []byte
	var runErr error
	cpu, err := cpuDuring(t.cpuPID(), func() { out, runErr = t.guestCommand(ctx, args...).Output() })
	if err != nil {
		return res, err
	}
	res.cpu = cpu
	var o iperfOut
	if err := json.Unmarshal(out, &o); err != nil {
		if runErr != nil {
			return res, fmt.Errorf("iperf3: %w: %s", runErr, firstLine(out, runErr))
		}
		return res, fmt.Errorf("iperf3 output: %w", err)
	}
	if o.Error != "" {
		return res, fmt.Errorf("iperf3: %s", o.Error)
	}
	if runErr != nil {
		return res, fmt.Errorf("iperf3: %w: %s", runErr, firstLine(out, runErr))
	}
	if s.udp {
		if r := o.End.SumReceived; r.Seconds > 0 {
			res.bytes, res.gbits, res.seconds = r.Bytes, r.BitsPerSecond/1e9, r.Seconds
			res.sentGbits = o.End.SumSent.BitsPerSecond / 1e9
			res.lossPercent = r.LostPercent
			return res, nil
		}
		// Older iperf3: the summary carries the sender's packets and the
		// receiver's loss count; what arrived is the difference.
		u := o.End.Sum
		if u.Seconds <= 0 || u.Packets <= 0 {
			return res, fmt.Errorf("iperf3 UDP: empty summary")
		}
		res.seconds = u.Seconds
		got := max(u.Packets-u.LostPackets, 0)
		res.bytes = got * udpLen
		res.gbits = float64(res.bytes) * 8 / u.Seconds / 1e9
		res.sentGbits = float64(u.Packets*udpLen) * 8 / u.Seconds / 1e9
		res.lossPercent = u.LostPercent
		return res, nil
	}
	r := o.End.SumReceived
	if r.Seconds <= 0 {
		return res, fmt.Errorf("iperf3: empty summary")
	}
	res.bytes, res.seconds = r.Bytes, r.Seconds
	res.gbits = r.BitsPerSecond / 1e9
	res.sentGbits = o.End.SumSent.BitsPerSecond / 1e9
	return res, nil
}

// cpuDuring runs fn and returns the CPU seconds process pid spent
// meanwhile (0 for pid 0: the kernel rows).
func cpuDuring(pid int, fn func()) (float64, error) {
	if pid <= 0 {
		fn()
		return 0, nil
	}
	cpu0, err := cpuSeconds(pid)
	if err != nil {
		return 0, fmt.Errorf("back-end cpu: %w", err)
	}
	fn()
	cpu1, err := cpuSeconds(pid)
	if err != nil {
		return 0, fmt.Errorf("back-end cpu (back-end gone?): %w", err)
	}
	return cpu1 - cpu0, nil
}

// firstLine is the first line of iperf3's complaint, from stdout or, for a
// parameter error, stderr.
func firstLine(out []byte, err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(bytes.TrimSpace(ee.Stderr)) > 0 {
		out = ee.Stderr
	}
	line, _, _ := bytes.Cut(bytes.TrimSpace(out), []byte("\n"))
	return string(line)
}

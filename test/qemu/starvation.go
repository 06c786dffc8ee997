package qemu

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// A TCG guest is a CPU-bound process: on a loaded machine (other helpers'
// builds, other guests) it waits for a CPU for most of a wall-clock
// timeout and does not boot, let alone answer, in time (a boot took 58 s
// at load 24). Timeouts on a guest therefore count only the time QEMU was
// not kept from running: wall time less the time its most delayed thread
// spent runnable but waiting for a CPU (the kernel's per-thread run_delay,
// /proc/PID/task/TID/schedstat). A guest that waits for the network (a
// back-end that does not answer) sleeps, is not delayed, and times out on
// the wall clock as before; a starved one gets the time it was denied, up
// to starvedCap times the timeout.

// starvedCap bounds how far a timeout stretches for a starved QEMU.
const starvedCap = 10

// starvation accumulates how long a process was kept from a CPU.
type starvation struct {
	pid   int
	last  map[int]uint64 // thread → run_delay (ns) at the last sample
	at    time.Time
	total time.Duration
}

func newStarvation(pid int) *starvation {
	s := &starvation{pid: pid}
	s.sample()
	return s
}

// sample adds the run delay of the process's most delayed thread since the
// last sample (no more than the time between the two) and returns the
// total so far.
func (s *starvation) sample() time.Duration {
	now := time.Now()
	cur := map[int]uint64{}
	var worst uint64
	dir := fmt.Sprintf("/proc/%d/task", s.pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(dir + "/" + e.Name() + "/schedstat")
		if err != nil {
			continue
		}
		// "cpu_time_ns run_delay_ns timeslices"
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		d, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		cur[tid] = d
		if prev, ok := s.last[tid]; ok && d > prev {
			worst = max(worst, d-prev)
		}
	}
	if !s.at.IsZero() {
		s.total += min(time.Duration(worst), now.Sub(s.at))
	}
	s.last, s.at = cur, now
	return s.total
}

// loadDeadline is a timeout that does not count the time a process waited
// for a CPU, up to starvedCap times the timeout.
type loadDeadline struct {
	start   time.Time
	timeout time.Duration
	st      *starvation
}

func newLoadDeadline(pid int, timeout time.Duration) *loadDeadline {
	return &loadDeadline{start: time.Now(), timeout: timeout, st: newStarvation(pid)}
}

// expired samples the process and reports whether the timeout has passed.
func (d *loadDeadline) expired() bool {
	wall := time.Since(d.start)
	return wall-d.st.sample() > d.timeout || wall > starvedCap*d.timeout
}

// String says how long the wait was and how much of it the process was
// kept from a CPU.
func (d *loadDeadline) String() string {
	wall := time.Since(d.start)
	starved := d.st.total
	if starved < time.Second {
		return fmt.Sprintf("%v", d.timeout)
	}
	return fmt.Sprintf("%v (%v of wall time, %v of it QEMU waiting for a CPU)",
		d.timeout, wall.Round(time.Second), starved.Round(time.Second))
}

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/guest"
)

// hopper moves the agent's transmissions from one TX queue to the next
// while a check runs (guest.ParamQueueHop).
type hopper struct {
	mode   string
	period time.Duration
	n      int      // vCPUs (cpu) or TX queues (xps)
	xps    []string // xps: each TX queue's xps_cpus file
	saved  []string // xps: their contents before
	all    string   // xps: the mask of every vCPU
	hops   int
}

// newHopper reads guest.ParamQueueHop; nil when it is not set.
func (a *agent) newHopper() (*hopper, error) {
	v := a.params.Values[guest.ParamQueueHop]
	if v == "" {
		return nil, nil
	}
	mode, p, _ := strings.Cut(v, ",")
	period, err := time.ParseDuration(p)
	if err != nil || period <= 0 {
		return nil, fmt.Errorf("%s=%q: want mode,period", guest.ParamQueueHop, v)
	}
	h := &hopper{mode: mode, period: period}
	cpus := onlineCPUs()
	switch mode {
	case guest.QueueHopCPU:
		h.n = cpus
	case guest.QueueHopXPS:
		h.xps, _ = filepath.Glob("/sys/class/net/" + ifName + "/queues/tx-*/xps_cpus")
		sort.Strings(h.xps) // tx-0 … tx-9 (fewer than ten queues here)
		h.n = len(h.xps)
		for _, f := range h.xps {
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("xps: %w", err)
			}
			h.saved = append(h.saved, strings.TrimSpace(string(b)))
		}
		h.all = strconv.FormatUint(1<<cpus-1, 16)
	default:
		return nil, fmt.Errorf("%s: mode %q", guest.ParamQueueHop, mode)
	}
	if h.n < 2 {
		return nil, fmt.Errorf("queue hops: %d %s, nothing to move between", h.n, mode)
	}
	return h, nil
}

// onlineCPUs counts the vCPUs in /sys/devices/system/cpu/online ("0-3").
func onlineCPUs() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return 1
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, ok := strings.Cut(r, "-")
		a, _ := strconv.Atoi(lo)
		z := a
		if ok {
			z, _ = strconv.Atoi(hi)
		}
		n += z - a + 1
	}
	return n
}

// during runs check while moving; the result gets the hop fields.
func (h *hopper) during(ctx context.Context, check func(context.Context) guest.Result) guest.Result {
	done := make(chan struct{})
	stopped := make(chan error, 1)
	go func() { stopped <- h.run(done) }()
	r := check(ctx)
	close(done)
	err := <-stopped
	if r.Fields == nil {
		r.Fields = map[string]string{}
	}
	r.Fields["hops"] = strconv.Itoa(h.hops)
	r.Fields["hop_mode"] = h.mode
	r.Fields["hop_queues"] = strconv.Itoa(h.n)
	if err != nil {
		r.OK = false
		r.Fields["hop_error"] = err.Error()
	}
	return r
}

func (h *hopper) run(done <-chan struct{}) error {
	t := time.NewTicker(h.period)
	defer t.Stop()
	defer h.restore()
	for i := 1; ; i++ {
		select {
		case <-done:
			return nil
		case <-t.C:
		}
		if err := h.moveTo(i % h.n); err != nil {
			return err
		}
		h.hops++
	}
}

// moveTo makes k the vCPU the agent runs on (cpu) or the TX queue every
// vCPU sends on (xps).
func (h *hopper) moveTo(k int) error {
	if h.mode == guest.QueueHopXPS {
		for i, f := range h.xps {
			mask := "0"
			if i == k {
				mask = h.all
			}
			if err := os.WriteFile(f, []byte(mask), 0); err != nil {
				return fmt.Errorf("xps %s: %w", f, err)
			}
		}
		return nil
	}
	var set unix.CPUSet
	set.Set(k)
	return pinThreads(&set)
}

// pinThreads sets the affinity of every thread of the process (Go runs
// the agent's goroutines on any of them).
func pinThreads(set *unix.CPUSet) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("sched_setaffinity %d: %w", tid, err)
		}
	}
	return nil
}

// restore undoes the moves: every vCPU again, the driver's XPS maps.
func (h *hopper) restore() {
	if h.mode == guest.QueueHopXPS {
		for i, f := range h.xps {
			_ = os.WriteFile(f, []byte(h.saved[i]), 0)
		}
		return
	}
	var set unix.CPUSet
	for c := 0; c < h.n; c++ {
		set.Set(c)
	}
	_ = pinThreads(&set)
}

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rig "vunet/test/rig/lib"
)

// cpuSeconds is the process's user+system CPU time so far, all threads.
func cpuSeconds(pid int) (float64, error) {
	u, sys, err := rig.ProcCPU(pid)
	return u + sys, err
}

// statusKiB reads a "kB" line of /proc/<pid>/status, e.g. VmHWM or VmRSS.
func statusKiB(pid int, key string) (int64, error) {
	return rig.ProcField(fmt.Sprintf("/proc/%d/status", pid), key)
}

// rssSplit is a process's resident memory by kind, from /proc/<pid>/status.
type rssSplit struct {
	anonKiB  int64 // RssAnon: heap, stacks, private mappings
	fileKiB  int64 // RssFile: mapped files, the program and its libraries among them
	shmemKiB int64 // RssShmem: shared memory, a vhost-user back-end's mapped memfd guest memory among it
	hugeKiB  int64 // HugetlbPages: hugetlbfs pages (guest memory backed by hugepages), in none of the above
}

// ownKiB is what the process holds itself: anonymous memory and mapped
// files, not shared memory or hugetlbfs pages.
func (m rssSplit) ownKiB() int64 { return m.anonKiB + m.fileKiB }

// readRSSSplit reads pid's RssAnon, RssFile, RssShmem and HugetlbPages
// (missing on kernels without hugetlbfs) in one read of its status file,
// so that they describe one moment.
func readRSSSplit(pid int) (rssSplit, error) {
	v, err := rig.ProcFields(fmt.Sprintf("/proc/%d/status", pid), []string{"RssAnon", "RssFile", "RssShmem"}, []string{"HugetlbPages"})
	if err != nil {
		// A kernel thread, or a process that has exited, has no Rss lines.
		return rssSplit{}, err
	}
	return rssSplit{anonKiB: v[0], fileKiB: v[1], shmemKiB: v[2], hugeKiB: v[3]}, nil
}

// ownPeak follows a process's own memory (rssSplit.ownKiB) while a round
// runs and keeps its largest sample: the kernel keeps a peak only of the
// whole RSS (VmHWM), which counts the front-end's memory too, and a
// reading at the round's end would miss what the Go runtime has given
// back to the kernel since. It stops at the first failed read: the
// process has gone, and its pid may soon be another's.
type ownPeak struct {
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	taken atomic.Int64 // samples taken so far, for tests to wait on
	peak  rssSplit     // the sample with the largest ownKiB
	err   error        // the read that ended the sampling
}

// ownPeakEvery is how often ownPeak samples: the rows it spans last
// seconds each, and one read of /proc/PID/status costs tens of
// microseconds of this process's CPU (which the rig-alone rows count).
const ownPeakEvery = 100 * time.Millisecond

// watchOwnRSS starts sampling pid's own memory until Stop.
func watchOwnRSS(pid int) *ownPeak {
	p := &ownPeak{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(ownPeakEvery)
		defer tick.Stop()
		sample := func() bool {
			m, err := readRSSSplit(pid)
			if err != nil {
				p.err = err
				return false
			}
			if m.ownKiB() > p.peak.ownKiB() {
				p.peak = m
			}
			p.taken.Add(1)
			return true
		}
		for sample() {
			select {
			case <-p.stop:
				sample()
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// Stop takes a last sample and returns the peak and the number of samples
// it was taken from, with the error that ended the sampling early, if one
// did (the peak is then of the samples before it). Stopping again returns
// the same.
func (p *ownPeak) Stop() (rssSplit, int, error) {
	p.once.Do(func() { close(p.stop) })
	<-p.done
	return p.peak, int(p.taken.Load()), p.err
}

// openFilesLimit is the process's soft RLIMIT_NOFILE as /proc shows it.
func openFilesLimit(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			fs := strings.Fields(rest)
			if len(fs) > 0 {
				if fs[0] == "unlimited" {
					return 1 << 62, nil
				}
				return strconv.ParseInt(fs[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/limits: no open files line", pid)
}

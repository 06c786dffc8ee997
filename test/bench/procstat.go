package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

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
	fileKiB  int64 // RssFile: mapped files, the program's own pages among them
	shmemKiB int64 // RssShmem: shared memory, a vhost-user back-end's mapped guest memory among it
}

// readRSSSplit reads pid's RssAnon, RssFile and RssShmem.
func readRSSSplit(pid int) (rssSplit, error) {
	var m rssSplit
	for _, f := range []struct {
		key string
		dst *int64
	}{{"RssAnon", &m.anonKiB}, {"RssFile", &m.fileKiB}, {"RssShmem", &m.shmemKiB}} {
		v, err := statusKiB(pid, f.key)
		if err != nil {
			return rssSplit{}, err
		}
		*f.dst = v
	}
	return m, nil
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

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	rig "vunet/test/rig/lib"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat
// (100 on every Linux architecture Go supports).
const clockTicks = 100

// cpuSeconds is the process's user+system CPU time so far, all threads.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces and parentheses: fields start
	// after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return float64(ut+st) / clockTicks, nil
}

// statusKiB reads a "kB" line of /proc/<pid>/status, e.g. VmHWM or VmRSS.
func statusKiB(pid int, key string) (int64, error) {
	return rig.ProcField(fmt.Sprintf("/proc/%d/status", pid), key)
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

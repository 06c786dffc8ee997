package rig

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// ProcField reads the number of a "key: number [unit]" line of a /proc
// file such as /proc/meminfo or /proc/<pid>/status.
func ProcField(path, key string) (int64, error) {
	v, err := ProcFields(path, []string{key}, nil)
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

// ProcFields reads the numbers of several "key: number [unit]" lines of a
// /proc file in one read, so that they describe one moment: the values of
// keys, then of optional, in that order. A key the file lacks is an
// error; an optional one reads as 0 (a field of a kernel feature that is
// not built in, such as HugetlbPages).
func ProcFields(path string, keys, optional []string) ([]int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	all := append(slices.Clip(keys), optional...)
	vals := make([]int64, len(all))
	seen := make([]bool, len(all))
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		i := slices.Index(all, k)
		if !ok || i < 0 || seen[i] {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 0 {
			return nil, fmt.Errorf("%s: %s has no number", path, k)
		}
		if vals[i], err = strconv.ParseInt(fs[0], 10, 64); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, k, err)
		}
		seen[i] = true
	}
	for i, k := range keys {
		if !seen[i] {
			return nil, fmt.Errorf("%s: no %s", path, k)
		}
	}
	return vals, nil
}

// ProcCPU is the user and system CPU time, in seconds, that process pid
// (all its threads) has used so far, from /proc/PID/stat.
func ProcCPU(pid int) (user, system float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name may contain spaces and parentheses: fields start
	// after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return float64(ut) / clockTicks, float64(st) / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat
// (100 on every Linux architecture Go supports).
const clockTicks = 100

// SNMPTable reads table proto ("Tcp", "Udp", ...) of /proc/net/snmp's
// text: a line of names, then a line of values, both starting "proto:".
// Read it from /proc/thread-self/net/snmp on a thread inside a network
// namespace: /proc/self/net is the main thread's namespace.
func SNMPTable(snmp []byte, proto string) (map[string]int64, error) {
	var names []string
	for line := range strings.Lines(string(snmp)) {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != proto+":" {
			continue
		}
		if names == nil {
			names = f[1:]
			continue
		}
		out := make(map[string]int64, len(names))
		for i, v := range f[1:] {
			if i < len(names) {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("/proc/net/snmp %s %s: %w", proto, names[i], err)
				}
				out[names[i]] = n
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("/proc/net/snmp: no %s table", proto)
}

package qemu

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// A process that does not exit is either slow (its threads are runnable
// or use CPU: a loaded machine) or stuck (every thread asleep and no CPU
// time moving: it waits for something, e.g. a vhost-user reply from the
// back-end). Tests tell the two apart by sampling /proc instead of by a
// longer timeout.

// threadState is one thread of a process as /proc shows it.
type threadState struct {
	tid     int
	comm    string
	state   byte   // R, S, D, T, Z...
	ticks   uint64 // utime+stime, clock ticks
	wchan   string // kernel function it sleeps in
	syscall string // /proc/.../syscall: number and arguments, or "running"
	stack   string // kernel stack, one frame per " < " (root only)
}

// procThreads reads every thread of pid; an error when the process is gone.
func procThreads(pid int) ([]threadState, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []threadState
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		td := filepath.Join(dir, e.Name())
		stat, err := os.ReadFile(filepath.Join(td, "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		ts := threadState{tid: tid}
		// comm is in parentheses and may hold spaces: fields count from
		// the last ')'.
		s := string(stat)
		if i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')'); i >= 0 && j > i {
			ts.comm = s[i+1 : j]
			f := strings.Fields(s[j+1:])
			if len(f) > 12 {
				ts.state = f[0][0]
				ut, _ := strconv.ParseUint(f[11], 10, 64)
				st, _ := strconv.ParseUint(f[12], 10, 64)
				ts.ticks = ut + st
			}
		}
		ts.wchan = readTrim(filepath.Join(td, "wchan"))
		ts.syscall = readTrim(filepath.Join(td, "syscall"))
		var frames []string
		for _, l := range strings.Split(readTrim(filepath.Join(td, "stack")), "\n") {
			// "[<0>] do_sys_poll+0x.../0x..."
			if _, fn, ok := strings.Cut(l, "] "); ok {
				fn, _, _ = strings.Cut(fn, "+")
				frames = append(frames, fn)
			}
		}
		ts.stack = strings.Join(frames, " < ")
		out = append(out, ts)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].tid < out[j].tid })
	return out, nil
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// formatThreads is a report of ts, one thread a line.
func formatThreads(ts []threadState) string {
	var b strings.Builder
	for _, t := range ts {
		fmt.Fprintf(&b, "  %d %-16s %c cpu=%d ticks wchan=%s syscall=[%s]", t.tid, t.comm, t.state, t.ticks, t.wchan, firstFields(t.syscall, 3))
		if t.stack != "" {
			fmt.Fprintf(&b, " stack: %s", t.stack)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func firstFields(s string, n int) string {
	f := strings.Fields(s)
	if len(f) > n {
		f = f[:n]
	}
	return strings.Join(f, " ")
}

// stuckFor samples pid's threads until the process exits (exited closes,
// or /proc shows it gone or a zombie),
// the process has been stuck for quiet — every thread asleep (not
// runnable) and no CPU time used — or limit passes. It returns whether it
// was stuck, with the last sample. A process that stays runnable or keeps
// using CPU is slow, not stuck, and is given up to limit.
func stuckFor(pid int, exited <-chan struct{}, quiet, limit time.Duration) (stuck bool, last []threadState) {
	deadline := time.Now().Add(limit)
	var since time.Time
	var prevTicks uint64
	for first := true; ; first = false {
		ts, err := procThreads(pid)
		if err != nil {
			return false, last
		}
		last = ts
		var ticks uint64
		runnable, alive := false, false
		for _, t := range ts {
			ticks += t.ticks
			runnable = runnable || t.state == 'R'
			alive = alive || (t.state != 'Z' && t.state != 'X')
		}
		if !alive {
			return false, ts // exited, not reaped yet
		}
		if first || runnable || ticks != prevTicks {
			since = time.Now()
		} else if time.Since(since) >= quiet {
			return true, ts
		}
		prevTicks = ticks
		if time.Now().After(deadline) {
			return false, ts
		}
		select {
		case <-exited:
			return false, ts
		case <-time.After(100 * time.Millisecond):
		}
	}
}

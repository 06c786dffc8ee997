package rig

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ownerPID extracts the pid from vunet-rig-<pid>-… (0 if it has none).
func ownerPID(name string) int {
	rest, ok := strings.CutPrefix(name, namePrefix)
	if !ok {
		return 0
	}
	s, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(s)
	if err != nil {
		return 0
	}
	return pid
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// killNetnsPids kills every process still inside namespace ns.
func killNetnsPids(ns string) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// Sweep removes what rigs of dead processes left behind: their namespaces
// (after killing any process still inside) and work directories. Rigs of
// live processes, including this one, are left alone.
func Sweep() error {
	var errs []error
	if ents, err := os.ReadDir(netnsDir); err == nil {
		for _, e := range ents {
			n := e.Name()
			if !strings.HasPrefix(n, namePrefix) || alive(ownerPID(n)) {
				continue
			}
			killNetnsPids(n)
			if err := delNetns(n); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if ents, err := os.ReadDir(os.TempDir()); err == nil {
		for _, e := range ents {
			n := e.Name()
			if !strings.HasPrefix(n, namePrefix) || alive(ownerPID(n)) {
				continue
			}
			os.RemoveAll(filepath.Join(os.TempDir(), n))
		}
	}
	return errors.Join(errs...)
}

// Stale lists the namespaces Sweep would remove.
func Stale() []string {
	var out []string
	ents, _ := os.ReadDir(netnsDir)
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, namePrefix) && !alive(ownerPID(n)) {
			out = append(out, n)
		}
	}
	return out
}

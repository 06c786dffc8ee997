package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// inNetns runs fn on an OS thread inside the named namespace. The thread is
// never unlocked, so it dies with the goroutine instead of going back to the
// scheduler inside a foreign namespace; sockets fn creates stay the
// namespace's and are usable from any goroutine afterwards.
func inNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(filepath.Join("/run/netns", name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", name, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// ipCmd runs iproute2 and returns its error with its output.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setSysctls writes per-namespace sysctls inside namespace ns.
func setSysctls(ns string, kv map[string]string) error {
	return inNetns(ns, func() error {
		for k, v := range kv {
			p := filepath.Join("/proc/sys", strings.ReplaceAll(k, ".", "/"))
			if err := os.WriteFile(p, []byte(v), 0); err != nil {
				return fmt.Errorf("sysctl %s=%q in %s: %w", k, v, ns, err)
			}
		}
		return nil
	})
}

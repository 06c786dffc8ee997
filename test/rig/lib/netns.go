package rig

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// netnsDir is where iproute2 keeps named network namespaces.
const netnsDir = "/run/netns"

// namePrefix starts every namespace and work directory the rig creates, so
// Sweep can find what a dead run left behind.
const namePrefix = "vunet-rig-"

// ip runs iproute2 and returns its error with its output.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func addNetns(name string) error { return ip("netns", "add", name) }

// delNetns removes a namespace's name; the namespace itself goes away when
// its last process and device do.
func delNetns(name string) error {
	if _, err := os.Stat(filepath.Join(netnsDir, name)); os.IsNotExist(err) {
		return nil
	}
	return ip("netns", "del", name)
}

// inNetns runs fn on an OS thread that has entered namespace name. The
// thread is never unlocked: it dies with the goroutine instead of going back
// to the scheduler's pool inside a foreign namespace. Sockets and devices fn
// creates belong to that namespace and stay usable from any thread. fn must
// not start processes: a child's Pdeathsig fires when its parent thread
// exits.
func inNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(filepath.Join(netnsDir, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
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

// setSysctls writes /proc/sys entries inside namespace ns (only the
// per-namespace ones, such as net.ipv4.tcp_rmem, are meaningful) and reads
// each back, so a key the namespace does not have is an error.
func setSysctls(ns string, kv map[string]string) error {
	if len(kv) == 0 {
		return nil
	}
	return inNetns(ns, func() error {
		for k, v := range kv {
			p := filepath.Join("/proc/sys", strings.ReplaceAll(k, ".", "/"))
			if err := os.WriteFile(p, []byte(v), 0); err != nil {
				return fmt.Errorf("sysctl %s=%q in %s: %w", k, v, ns, err)
			}
			got, err := os.ReadFile(p)
			if err != nil {
				return fmt.Errorf("read back sysctl %s in %s: %w", k, ns, err)
			}
			if strings.Join(strings.Fields(string(got)), " ") != strings.Join(strings.Fields(v), " ") {
				return fmt.Errorf("sysctl %s in %s: wrote %q, reads %q", k, ns, v, strings.TrimSpace(string(got)))
			}
		}
		return nil
	})
}

package rig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// lowestFreeFD is the lowest descriptor number process pid has not open:
// a soft RLIMIT_NOFILE of that value leaves it no descriptor to open.
func lowestFreeFD(t testing.TB, pid int) uint64 {
	t.Helper()
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	open := map[uint64]bool{}
	for _, e := range es {
		n, err := strconv.ParseUint(e.Name(), 10, 64)
		if err == nil {
			open[n] = true
		}
	}
	var fd uint64
	for open[fd] {
		fd++
	}
	return fd
}

// nofileLimit reads process pid's RLIMIT_NOFILE from /proc/PID/limits,
// which anyone may read (prlimit(2) needs CAP_SYS_RESOURCE or the
// process's own user, and the sandboxed daemon is nobody).
func nofileLimit(t testing.TB, pid int) unix.Rlimit {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "Max open files") {
			continue
		}
		f := strings.Fields(strings.TrimPrefix(line, "Max open files"))
		if len(f) < 2 {
			break
		}
		cur, err1 := strconv.ParseUint(f[0], 10, 64)
		max, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			break
		}
		return unix.Rlimit{Cur: cur, Max: max}
	}
	t.Fatalf("no open-files limit in /proc/%d/limits:\n%s", pid, b)
	return unix.Rlimit{}
}

// setNofileLimit sets process pid's RLIMIT_NOFILE. Root without
// CAP_SYS_RESOURCE (some containers: this machine's root lacks it) may not
// change another user's limits, and the sandbox made vunet nobody; a
// process of vunet's own user and group may, so prlimit(1) runs as that.
func setNofileLimit(t testing.TB, pid int, l unix.Rlimit) {
	t.Helper()
	perr := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &l, nil)
	if perr == nil || !errors.Is(perr, unix.EPERM) {
		if perr != nil {
			t.Fatal(perr)
		}
		return
	}
	uid, gid, err := procIDs(pid)
	if err != nil {
		t.Fatal(err)
	}
	bin, err := exec.LookPath("prlimit")
	if err != nil {
		t.Fatalf("prlimit(2) refused (%v) and no prlimit(1) to run as vunet's user: apt-get install util-linux", perr)
	}
	cmd := exec.Command(bin, "--pid", strconv.Itoa(pid), fmt.Sprintf("--nofile=%d:%d", l.Cur, l.Max))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("prlimit as %d:%d: %v: %s", uid, gid, err, out)
	}
	if got := nofileLimit(t, pid); got != l {
		t.Fatalf("open-files limit %v after prlimit, want %v", got, l)
	}
}

// procIDs returns process pid's real user and group IDs.
func procIDs(pid int) (uid, gid uint32, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	var u, g uint64
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "Uid":
			u, err = strconv.ParseUint(f[0], 10, 32)
		case "Gid":
			g, err = strconv.ParseUint(f[0], 10, 32)
		}
		if err != nil {
			return 0, 0, err
		}
	}
	return uint32(u), uint32(g), nil
}

// TestRigDescriptorLimit runs vunet out of descriptors (its soft
// RLIMIT_NOFILE lowered under it with prlimit) while host peers connect to
// a forwarded port and the guest opens a connection: the forwarded port's
// listener must not spin on the connections it cannot accept (it did:
// level-triggered, accept failing with EMFILE, the loop woke up at full
// speed), the guest's connection is refused at once (an RST for the
// socket() that failed), and once descriptors are free again the waiting
// connections reach the guest and carry data.
func TestRigDescriptorLimit(t *testing.T) {
	const port = 18080
	r := startRig(t, Options{Backend: append(append([]string{}, DefaultBackend...), "-t", strconv.Itoa(port))})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The guest serves the forwarded port: each connection gets a line.
	var gl net.Listener
	if err := r.InGuest(func() (err error) {
		gl, err = net.Listen("tcp4", ":"+strconv.Itoa(port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer gl.Close()
	go func() {
		for {
			c, err := gl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("hello from the guest\n"))
				io.Copy(io.Discard, c)
			}()
		}
	}()
	hostEcho, err := r.HostListen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostEcho.Close()
	// The guest learns its MAC at the back-end (forwarded connections need
	// it) and a connection works before the limit.
	c, err := r.GuestDial(ctx, "tcp4", net.JoinHostPort(r.Gateway().String(), strconv.Itoa(hostEcho.Addr().(*net.TCPAddr).Port)))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	pid := r.BackendPID()
	m0 := metrics(t, r)
	old := nofileLimit(t, pid)
	lim := unix.Rlimit{Cur: lowestFreeFD(t, pid), Max: old.Max}
	setNofileLimit(t, pid, lim)
	lifted := false
	lift := func() {
		if !lifted {
			lifted = true
			setNofileLimit(t, pid, old)
		}
	}
	defer lift()
	t.Logf("vunet (pid %d) limited to %d descriptors", pid, lim.Cur)

	// Host peers connect to the forwarded port: the kernel completes their
	// handshakes, vunet cannot accept them.
	var peers []net.Conn
	for range 3 {
		var pc net.Conn
		if err := r.InHost(func() (err error) {
			pc, err = net.DialTimeout("tcp4", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		peers = append(peers, pc)
	}
	// The guest's connection at the limit is refused at once.
	start := time.Now()
	c, err = r.GuestDial(ctx, "tcp4", net.JoinHostPort(r.Gateway().String(), strconv.Itoa(hostEcho.Addr().(*net.TCPAddr).Port)))
	if err == nil {
		c.Close()
		t.Errorf("a guest connection succeeded with vunet out of descriptors")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("guest connection at the limit: %v, want connection refused (an RST)", err)
	} else {
		t.Logf("guest connection at the limit refused after %v", time.Since(start).Round(time.Millisecond))
	}
	// Two seconds at the limit with connections waiting.
	cpuNow := func() float64 {
		u, s, err := ProcCPU(pid)
		if err != nil {
			t.Fatal(err)
		}
		return u + s
	}
	cpu0 := cpuNow()
	time.Sleep(2 * time.Second)
	cpu := cpuNow() - cpu0
	lift()

	// Descriptors are free again: the waiting connections reach the guest.
	for i, pc := range peers {
		pc.SetReadDeadline(time.Now().Add(10 * time.Second))
		line := make([]byte, len("hello from the guest\n"))
		if _, err := io.ReadFull(pc, line); err != nil || string(line) != "hello from the guest\n" {
			t.Errorf("forwarded connection %d after the limit was lifted: %q, %v", i, line, err)
		}
	}
	m := metrics(t, r)
	wakeups := m.Sum("vunet_queue_loop_wakeups_total") - m0.Sum("vunet_queue_loop_wakeups_total")
	backoffs := m.Sum("vunet_tcp_accept_backoffs_total") - m0.Sum("vunet_tcp_accept_backoffs_total")
	t.Logf("at the limit for 2 s: %.2f s of CPU; loop wake-ups %v, accept back-offs %v, forwarded connections accepted %v, connect failures %v",
		cpu, wakeups, backoffs, m.Sum("vunet_tcp_accepted_total")-m0.Sum("vunet_tcp_accepted_total"),
		m.Sum("vunet_tcp_connect_failures_total")-m0.Sum("vunet_tcp_connect_failures_total"))
	// Backing off from 50 ms up to 1 s is a handful of wake-ups in those
	// seconds; a listener reported by every epoll_wait is tens of
	// thousands.
	if wakeups > 1000 {
		t.Errorf("the loop woke up %v times while its forwarded port could not accept (it spins)", wakeups)
	}
	if backoffs == 0 {
		t.Errorf("no accept back-off counted")
	}
	healthy(t, r)
}

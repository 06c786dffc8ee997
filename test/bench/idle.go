package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// idleResult is the back-end's memory with many idle connections open.
type idleResult struct {
	opened          int
	firstErr        error // first failed dial, if any (the test goes on without it)
	baseKiB, rssKiB int64 // VmRSS before and with the connections open
	hwmKiB          int64 // VmHWM afterwards
}

// idleConns opens n TCP connections from the guest to a host listener
// through t, waits until all are established on the host side, reads the
// back-end's RSS, and closes everything.
func idleConns(ctx context.Context, t *target, n int) (idleResult, error) {
	var res idleResult
	pid := t.pid()
	// The host side never accepts: the connections stay fully established
	// in the listener's accept queue, so they cost this process no file
	// descriptors (the hard open-files limit may not be raisable without
	// CAP_SYS_RESOURCE) while the back-end holds its socket for each.
	var lfd int
	err := t.inHost(func() error {
		var err error
		if lfd, err = backlogListener(t.listenIP, idlePort, n+128); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("idle listener: %w", err)
	}
	defer unix.Close(lfd)
	var guest []net.Conn
	defer func() {
		for _, c := range guest {
			c.Close()
		}
	}()
	time.Sleep(500 * time.Millisecond) // let the previous test's flows go
	if pid > 0 {
		if res.baseKiB, err = statusKiB(pid, "VmRSS"); err != nil {
			return res, err
		}
	}
	addr := net.JoinHostPort(t.serverIP, strconv.Itoa(idlePort))
	// Four dialers at a time: the back-end sees a burst of SYNs, as from a
	// guest that opens a connection pool, without a listen-queue overflow.
	const workers = 4
	conns := make([][]net.Conn, workers)
	errs := make([]error, workers)
	var dw sync.WaitGroup
	for w := 0; w < workers; w++ {
		dw.Add(1)
		go func() {
			defer dw.Done()
			errs[w] = t.inGuest(func() error {
				d := &net.Dialer{Timeout: 10 * time.Second}
				var first error
				for i := w; i < n && ctx.Err() == nil; i += workers {
					c, err := d.DialContext(ctx, "tcp4", addr)
					if err != nil {
						// A refused or lost connection is the back-end's
						// answer to record, not a reason to stop.
						if first == nil {
							first = fmt.Errorf("connection %d: %w", i, err)
						}
						continue
					}
					conns[w] = append(conns[w], c)
				}
				return first
			})
		}()
	}
	dw.Wait()
	for w := range conns {
		guest = append(guest, conns[w]...)
	}
	res.opened = len(guest)
	for _, e := range errs {
		if e != nil && res.firstErr == nil {
			res.firstErr = e
		}
	}
	if res.opened == 0 {
		return res, fmt.Errorf("no connection opened: %w", res.firstErr)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		q, err := acceptQueue(ctx, t, idlePort)
		if err != nil {
			return res, err
		}
		if q >= res.opened {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("host side has %d of the %d connections the guest opened", q, res.opened)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // idle: let any per-connection work settle
	if pid > 0 {
		if res.rssKiB, err = statusKiB(pid, "VmRSS"); err != nil {
			return res, err
		}
		if res.hwmKiB, err = statusKiB(pid, "VmHWM"); err != nil {
			return res, err
		}
	}
	return res, nil
}

// backlogListener listens on ip:port with the given backlog (Go's
// net.Listen caps it at the somaxconn it read at start-up, outside this
// namespace).
func backlogListener(ip string, port, backlog int) (int, error) {
	a, err := netip.ParseAddr(ip)
	if err != nil || !a.Is4() {
		return -1, fmt.Errorf("listen address %q: not IPv4", ip)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: a.As4()}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s:%d: %w", ip, port, err)
	}
	if err := unix.Listen(fd, backlog); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen %s:%d: %w", ip, port, err)
	}
	return fd, nil
}

// acceptQueue is the number of established connections waiting in the
// accept queue of the listener on port in t's host namespace (Recv-Q of a
// listening socket in ss).
func acceptQueue(ctx context.Context, t *target, port int) (int, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", t.hostNS, "ss", "-Hltn", "sport = :"+strconv.Itoa(port)).Output()
	if err != nil {
		return 0, fmt.Errorf("ss in %s: %w", t.hostNS, err)
	}
	f := strings.Fields(string(out))
	if len(f) < 2 {
		return 0, fmt.Errorf("ss in %s: no listener on port %d", t.hostNS, port)
	}
	return strconv.Atoi(f[1])
}

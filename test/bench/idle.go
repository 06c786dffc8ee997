package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// idleResult is the back-end's memory with many idle connections open.
type idleResult struct {
	opened          int
	baseKiB, rssKiB int64 // VmRSS before and with the connections open
	hwmKiB          int64 // VmHWM afterwards
}

// idleConns opens n TCP connections from the guest to a host listener
// through t, waits until the host side accepted them all, reads the
// back-end's RSS, and closes everything.
func idleConns(ctx context.Context, t *target, n int) (idleResult, error) {
	var res idleResult
	pid := t.pid()
	var l net.Listener
	err := t.inHost(func() (err error) {
		l, err = net.Listen("tcp4", net.JoinHostPort(t.listenIP, strconv.Itoa(idlePort)))
		return err
	})
	if err != nil {
		return res, fmt.Errorf("idle listener: %w", err)
	}
	var (
		mu       sync.Mutex
		accepted []net.Conn
		count    atomic.Int64
		wg       sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c)
			mu.Unlock()
			count.Add(1)
		}
	}()
	var guest []net.Conn
	defer func() {
		for _, c := range guest {
			c.Close()
		}
		l.Close()
		wg.Wait()
		for _, c := range accepted {
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
				for i := w; i < n; i += workers {
					c, err := d.DialContext(ctx, "tcp4", addr)
					if err != nil {
						return fmt.Errorf("connection %d: %w", i, err)
					}
					conns[w] = append(conns[w], c)
				}
				return nil
			})
		}()
	}
	dw.Wait()
	for w := range conns {
		guest = append(guest, conns[w]...)
	}
	res.opened = len(guest)
	for _, e := range errs {
		if e != nil {
			return res, fmt.Errorf("opened %d of %d: %w", len(guest), n, e)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for count.Load() < int64(n) {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("host side accepted %d of %d connections", count.Load(), n)
		}
		time.Sleep(50 * time.Millisecond)
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

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	rig "vunet/test/rig/lib"
)

// echoServer answers every byte it reads with the same byte until EOF, on
// each connection, in t's host namespace.
type echoServer struct {
	l  net.Listener
	wg sync.WaitGroup
}

func startEcho(t *target) (*echoServer, error) {
	var l net.Listener
	err := t.inHost(func() (err error) {
		l, err = net.Listen("tcp4", net.JoinHostPort(t.listenIP, strconv.Itoa(echoPort)))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("echo listener: %w", err)
	}
	s := &echoServer{l: l}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var b [1]byte
				for {
					if _, err := c.Read(b[:]); err != nil {
						return
					}
					if _, err := c.Write(b[:]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return s, nil
}

func (s *echoServer) close() { s.l.Close(); s.wg.Wait() }

func (t *target) echoAddr() string { return net.JoinHostPort(t.serverIP, strconv.Itoa(echoPort)) }

// rrConn is the latency test's connection to one target's echo server,
// open across the test's slices, with the round trips timed so far (µs).
type rrConn struct {
	c       net.Conn
	samples []float64
}

// dialRR connects to t's echo server from the guest namespace and warms
// the connection up.
func dialRR(ctx context.Context, t *target) (*rrConn, error) {
	var c net.Conn
	err := t.inGuest(func() (err error) {
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp4", t.echoAddr())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial echo: %w", err)
	}
	r := &rrConn{c: c, samples: make([]float64, 0, 1<<16)}
	for i := 0; i < 200; i++ { // warm-up: caches, flow set-up, delayed-ACK state
		if err := r.roundTrip(); err != nil {
			c.Close()
			return nil, fmt.Errorf("warm-up round trip: %w", err)
		}
	}
	return r, nil
}

func (r *rrConn) roundTrip() error {
	r.c.SetDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	if _, err := r.c.Write(b[:]); err != nil {
		return err
	}
	_, err := io.ReadFull(r.c, b[:])
	return err
}

// measure times 1-byte request/response round trips for d.
func (r *rrConn) measure(d time.Duration) error {
	end := time.Now().Add(d)
	for {
		t0 := time.Now()
		if t0.After(end) {
			return nil
		}
		if err := r.roundTrip(); err != nil {
			return fmt.Errorf("round trip %d: %w", len(r.samples), err)
		}
		r.samples = append(r.samples, float64(time.Since(t0).Nanoseconds())/1e3)
	}
}

// quantiles returns the p50 and p99 of the round trips (µs) and their
// count.
func (r *rrConn) quantiles() (p50, p99 float64, n int, err error) {
	if len(r.samples) == 0 {
		return 0, 0, 0, errors.New("no round trips")
	}
	s := slices.Clone(r.samples)
	slices.Sort(s)
	q := func(p float64) float64 { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return q(0.50), q(0.99), len(s), nil
}

// connectRate opens, uses (1-byte exchange) and closes connections one
// after another for d, from the guest namespace, and returns how many and
// how long that took. The client makes blocking system calls on one thread
// (rig.ConnectExchangeClose says why), as netperf's TCP_CRR does.
func connectRate(ctx context.Context, t *target, d time.Duration) (n int, took time.Duration, err error) {
	server, err := netip.ParseAddrPort(t.echoAddr())
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	end := start.Add(d)
	err = t.inGuest(func() error {
		for time.Now().Before(end) && ctx.Err() == nil {
			if err := rig.ConnectExchangeClose(server, 5*time.Second); err != nil {
				return fmt.Errorf("connection %d: %w", n, err)
			}
			n++
		}
		return ctx.Err()
	})
	return n, time.Since(start), err
}

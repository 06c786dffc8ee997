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

// pingPong measures 1-byte request/response round trips on one connection
// for d, and returns the p50 and p99 in microseconds and the count.
func pingPong(ctx context.Context, t *target, d time.Duration) (p50, p99 float64, n int, err error) {
	var c net.Conn
	err = t.inGuest(func() (err error) {
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp4", t.echoAddr())
		return err
	})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("dial echo: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d + 10*time.Second))
	var b [1]byte
	roundTrip := func() error {
		if _, err := c.Write(b[:]); err != nil {
			return err
		}
		_, err := io.ReadFull(c, b[:])
		return err
	}
	for i := 0; i < 200; i++ { // warm-up: caches, flow set-up, delayed-ACK state
		if err := roundTrip(); err != nil {
			return 0, 0, 0, fmt.Errorf("warm-up round trip: %w", err)
		}
	}
	samples := make([]float64, 0, 1<<16)
	end := time.Now().Add(d)
	for {
		t0 := time.Now()
		if t0.After(end) {
			break
		}
		if err := roundTrip(); err != nil {
			return 0, 0, 0, fmt.Errorf("round trip %d: %w", len(samples), err)
		}
		samples = append(samples, float64(time.Since(t0).Nanoseconds())/1e3)
	}
	if len(samples) == 0 {
		return 0, 0, 0, errors.New("no round trips")
	}
	slices.Sort(samples)
	q := func(p float64) float64 { return samples[min(len(samples)-1, int(p*float64(len(samples))))] }
	return q(0.50), q(0.99), len(samples), nil
}

// connectRate opens, uses (1-byte exchange) and closes connections one
// after another for d, from the guest namespace, and returns connections
// per second. The client makes blocking system calls on one thread
// (rig.ConnectExchangeClose says why), as netperf's TCP_CRR does.
func connectRate(ctx context.Context, t *target, d time.Duration) (rate float64, n int, err error) {
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
	return float64(n) / time.Since(start).Seconds(), n, err
}

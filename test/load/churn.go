package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Echo is a host peer that sends back what it reads, on TCP connections
// (Churn's) and UDP datagrams (UDPEcho's).
type Echo struct {
	TCP net.Listener
	UDP net.PacketConn
	wg  sync.WaitGroup
}

// StartEcho serves TCP and UDP echo on l and pc until Close.
func StartEcho(l net.Listener, pc net.PacketConn) *Echo {
	e := &Echo{TCP: l, UDP: pc}
	e.wg.Add(2)
	go func() {
		defer e.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Minute))
				io.Copy(c, c)
			}()
		}
	}()
	go func() {
		defer e.wg.Done()
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	return e
}

// Close stops the servers and waits for their connections to end.
func (e *Echo) Close() {
	e.TCP.Close()
	e.UDP.Close()
	e.wg.Wait()
}

// Churn opens one TCP connection after another from the guest to an echo
// peer, each carrying size bytes there and back, checked, until ctx ends.
type Churn struct {
	Conns  atomic.Int64 // connections that completed their exchange
	mu     sync.Mutex
	err    error
	done   chan struct{}
	cancel context.CancelFunc
}

// StartChurn runs workers concurrent churners, each opening at most
// perSecond connections a second; dial connects from the guest to the echo
// peer. The pace is what the guest's own kernel sustains: the guest closes
// first, so each connection holds one of its ~28,000 ephemeral ports in
// TIME_WAIT for 60 s, and an unpaced churn (~470 a second here) ran out of
// them in a minute (EADDRNOTAVAIL), a failure of the test's client, not of
// the back-end.
func StartChurn(ctx context.Context, dial func(ctx context.Context) (net.Conn, error), workers, perSecond, size int) *Churn {
	ctx, cancel := context.WithCancel(ctx)
	c := &Churn{done: make(chan struct{}), cancel: cancel}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := newPattern(uint64(w + 1))
			out := make([]byte, size)
			in := make([]byte, size)
			interval := time.Second / time.Duration(perSecond)
			next := time.Now()
			for ctx.Err() == nil {
				if d := time.Until(next); d > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(d):
					}
				}
				next = next.Add(interval)
				if now := time.Now(); next.Before(now) {
					next = now // behind (a slow exchange): no burst to catch up
				}
				g.fill(out)
				if err := c.once(ctx, dial, out, in); err != nil {
					if ctx.Err() == nil {
						c.fail(err)
					}
					return
				}
				c.Conns.Add(1)
			}
		}()
	}
	go func() { wg.Wait(); close(c.done) }()
	return c
}

func (c *Churn) once(ctx context.Context, dial func(ctx context.Context) (net.Conn, error), out, in []byte) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := dial(dctx)
	if err != nil {
		return fmt.Errorf("churn dial after %d connections: %w", c.Conns.Load(), err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	errc := make(chan error, 1)
	go func() { _, err := conn.Write(out); errc <- err }()
	if _, err := io.ReadFull(conn, in); err != nil {
		return fmt.Errorf("churn read after %d connections: %w", c.Conns.Load(), err)
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("churn write: %w", err)
	}
	if !bytes.Equal(in, out) {
		return errors.New("churn: the echo differs from what was sent")
	}
	return nil
}

func (c *Churn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
}

// Stop ends the churn and returns its first failure.
func (c *Churn) Stop() error {
	c.cancel()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// UDPEcho sends numbered datagrams from the guest to an echo peer at a
// rate, checking that what comes back is what was sent; a datagram may
// be lost (UDP), never altered.
type UDPEcho struct {
	Sent, Echoed atomic.Int64
	mu           sync.Mutex
	err          error
	done         chan struct{}
	cancel       context.CancelFunc
}

// StartUDPEcho sends size-byte datagrams on pc (a guest socket) to peer,
// rate a second, until Stop.
func StartUDPEcho(ctx context.Context, pc net.PacketConn, peer net.Addr, rate, size int) *UDPEcho {
	ctx, cancel := context.WithCancel(ctx)
	u := &UDPEcho{done: make(chan struct{}), cancel: cancel}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, size)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for seq := uint64(0); ; seq++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			datagram(buf, seq)
			if _, err := pc.WriteTo(buf, peer); err == nil {
				u.Sent.Add(1)
			}
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, size+1)
		want := make([]byte, size)
		for {
			pc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			seq := uint64(0)
			if n >= 8 {
				for i := range 8 {
					seq |= uint64(buf[i]) << (8 * i)
				}
			}
			datagram(want, seq)
			if n != size || !bytes.Equal(buf[:n], want) {
				u.mu.Lock()
				if u.err == nil {
					u.err = fmt.Errorf("UDP echo %d came back altered (%d bytes)", seq, n)
				}
				u.mu.Unlock()
				continue
			}
			u.Echoed.Add(1)
		}
	}()
	go func() { wg.Wait(); close(u.done) }()
	return u
}

// datagram fills b as datagram seq: its number, then a pattern of it.
func datagram(b []byte, seq uint64) {
	newPattern(seq + 1).fill(b)
	for i := 0; i < 8 && i < len(b); i++ {
		b[i] = byte(seq >> (8 * i))
	}
}

// Stop ends the echo after a grace period for the last replies and
// returns its first failure.
func (u *UDPEcho) Stop() error {
	time.Sleep(300 * time.Millisecond)
	u.cancel()
	<-u.done
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.err
}

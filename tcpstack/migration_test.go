package tcpstack

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"vunet/tcpstack/handover"
	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// migGuest is the guest's side of one TCP connection through a pair: it
// sends segments on the pair's TX ring and collects what the pair's RX ring
// delivers. Across a migration the guest (its sequence numbers) moves to
// another pair, as its memory does.
type migGuest struct {
	t            *testing.T
	p            *testPair
	sport, dport uint16
	seq, ack     uint32
	got          []byte // payload received, in order
}

func (g *migGuest) send(flags header.TCPFlags, payload []byte) {
	g.t.Helper()
	g.p.addTX(tcpGuestFrame(testGuest4, testGw4, g.sport, g.dport, g.seq, g.ack, flags, payload))
	g.p.tx.Send()
	g.seq += uint32(len(payload))
	if flags&header.TCPFlagSYN != 0 {
		g.seq++
	}
}

// until collects segments until cond holds on one; data is taken in order
// and acknowledged as a guest would.
func (g *migGuest) until(what string, cond func(header.TCP) bool) header.TCP {
	g.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		segs, _ := g.p.rxTCP(g.t)
		for _, s := range segs {
			if s.DestinationPort() != g.sport {
				continue
			}
			if n := len(s.Payload()); n > 0 {
				if s.SequenceNumber() != g.ack {
					g.t.Fatalf("data at %d, the guest expects %d", s.SequenceNumber(), g.ack)
				}
				g.got = append(g.got, s.Payload()...)
				g.ack += uint32(n)
				g.send(header.TCPFlagACK, nil)
			}
			if cond(s) {
				return s
			}
		}
		for g.p.rx.Free() > 0 {
			g.p.rx.AddBuffers(nil, 2048)
		}
		g.p.rx.Send()
		time.Sleep(time.Millisecond)
	}
	g.t.Fatalf("no %s (got %q so far)", what, g.got)
	return nil
}

func readFull(t *testing.T, c net.Conn, n int) string {
	t.Helper()
	b := make([]byte, n)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("host read: %v", err)
	}
	return string(b)
}

// hostListener listens on a loopback TCP port for a guest's connection;
// the connection it accepts comes on the channel.
func hostListener(t *testing.T) (net.Listener, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		testenv.Unavailable(t, err, "a loopback interface with 127.0.0.1")
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	return ln, accepted
}

// connectThrough starts src, with RX buffers posted on src and dst, and
// has a guest connect from port sport (first sequence number seq) through
// src to ln; it returns the guest and the host's side of the connection
// once the guest's ACK of the handshake reached the loop.
func connectThrough(t *testing.T, src, dst *testPair, ln net.Listener, accepted <-chan net.Conn, sport uint16, seq uint32) (g *migGuest, host net.Conn) {
	t.Helper()
	for _, p := range []*testPair{src, dst} {
		p.postRX(32, 2048)
	}
	src.start()
	g = &migGuest{t: t, p: src, sport: sport, dport: uint16(ln.Addr().(*net.TCPAddr).Port), seq: seq}
	g.send(header.TCPFlagSYN, nil)
	sa := g.until("SYN-ACK", func(s header.TCP) bool { return s.Flags().Has(header.TCPFlagSYN | header.TCPFlagACK) })
	g.ack = sa.SequenceNumber() + 1
	g.send(header.TCPFlagACK, nil)
	select {
	case host = <-accepted:
	case <-time.After(3 * time.Second):
		t.Fatal("no host connection")
	}
	t.Cleanup(func() { host.Close() })
	waitFor(t, "the connection established", 3*time.Second, func() bool {
		return src.s.PairTCPStats(0).ConnsByState[stats.TCPEstablished].Load() == 1
	})
	return g, host
}

// migPairs sets up a source and a destination Stack joined by a hand-over
// channel, with a guest connection established through the source.
func migPairs(t *testing.T) (src, dst *testPair, g *migGuest, host net.Conn) {
	t.Helper()
	ln, accepted := hostListener(t)
	src, dst = newFlowPair(t, featMrg, nil), newFlowPair(t, featMrg, nil)
	path := filepath.Join(t.TempDir(), "migrate.sock")
	l, err := handover.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	src.s.ServeMigration(l)
	c, err := handover.Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	dst.s.MigrateFrom(c)

	g, host = connectThrough(t, src, dst, ln, accepted, 45000, 1000)
	// The destination connected at start-up; the source accepts in the
	// background.
	waitFor(t, "the destination's channel", 3*time.Second, func() bool {
		src.s.mig.mu.Lock()
		defer src.s.mig.mu.Unlock()
		return src.s.mig.dest != nil
	})
	return src, dst, g, host
}

// exchangeBefore moves data both ways on the connection before it moves:
// what the destination must carry on from.
func exchangeBefore(t *testing.T, g *migGuest, host net.Conn) {
	t.Helper()
	host.Write([]byte("before "))
	g.until("data before", func(header.TCP) bool { return bytes.Equal(g.got, []byte("before ")) })
	g.send(header.TCPFlagACK|header.TCPFlagPSH, []byte("up1 "))
	if s := readFull(t, host, 4); s != "up1 " {
		t.Fatalf("host got %q", s)
	}
}

// TestMigrationHandsOverConnection: the source's rings stop during a
// migration, the connection goes to the destination, whose first pair
// start takes it over: the host peer's data sent meanwhile reaches the
// guest through the destination, in sequence, the guest's data reaches the
// peer, and the source holds nothing any more (ending its session resets
// no host peer).
func TestMigrationHandsOverConnection(t *testing.T) {
	src, dst, g, host := migPairs(t)
	exchangeBefore(t, g, host)

	// QEMU's stop-and-copy: the rings stop, then the control plane says so.
	src.s.StopPair(0)
	src.s.MigrationStopped()
	host.Write([]byte("during "))
	// The guest resumes on the destination.
	g.p = dst
	dst.start()
	g.until("data sent during the migration", func(header.TCP) bool { return bytes.Equal(g.got, []byte("before during ")) })
	host.Write([]byte("after"))
	g.until("data after", func(header.TCP) bool { return bytes.Equal(g.got, []byte("before during after")) })
	g.send(header.TCPFlagACK|header.TCPFlagPSH, []byte("up2"))
	if s := readFull(t, host, 3); s != "up2" {
		t.Fatalf("host got %q", s)
	}
	waitFor(t, "the source to forget the connection", 3*time.Second, func() bool {
		return src.s.PairTCPStats(0).ConnsByState[stats.TCPEstablished].Load() == 0
	})
	if n := dst.s.PairTCPStats(0).ConnsByState[stats.TCPEstablished].Load(); n != 1 {
		t.Fatalf("destination holds %d established connections", n)
	}
	// The source's front-end leaves (QEMU quits after the migration): the
	// host peer must not be reset.
	src.s.EndSession()
	host.Write([]byte("!"))
	g.until("data after the source's session ended", func(header.TCP) bool { return bytes.Equal(g.got, []byte("before during after!")) })
	// The guest closes: the host sees a FIN, not a reset.
	g.send(header.TCPFlagFIN|header.TCPFlagACK, nil)
	host.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := host.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("host read after the guest's FIN: %d, %v; want EOF", n, err)
	}
}

// TestMigrationFailedStaysWithSource: the rings stop, the state goes out,
// and the rings start on the source again (the migration failed): the
// destination is told to drop what it got, the connection goes on from
// the source, and a later start of the destination takes nothing.
func TestMigrationFailedStaysWithSource(t *testing.T) {
	src, dst, g, host := migPairs(t)
	src.s.StopPair(0)
	src.s.MigrationStopped()
	waitFor(t, "the state at the destination", 3*time.Second, func() bool {
		dst.s.mig.mu.Lock()
		defer dst.s.mig.mu.Unlock()
		return len(dst.s.mig.pending) == 1
	})
	src.restart()
	waitFor(t, "the destination to drop the state", 3*time.Second, func() bool {
		dst.s.mig.mu.Lock()
		defer dst.s.mig.mu.Unlock()
		return len(dst.s.mig.pending) == 0
	})
	host.Write([]byte("still here"))
	g.until("data through the source", func(header.TCP) bool { return bytes.Equal(g.got, []byte("still here")) })
	dst.start()
	if n := dst.s.PairTCPStats(0).ConnsByState[stats.TCPEstablished].Load(); n != 0 {
		t.Fatalf("the destination took %d connections after the ABORT", n)
	}
	// The source still owns it: ending its session resets the host peer.
	src.s.EndSession()
	host.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := host.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("host read after the source's session ended: %v, want ECONNRESET", err)
	}
}

// TestMigrationRefusedWithPairNotStopped: a loop that did not stop (one
// vhost-user abandoned at its stop deadline, still in s.stopping) may
// wake and use its pair's mailbox and tables, so neither a hand-over to a
// destination vunet nor SaveState reads them: the connection stays with
// the source, and is still served there once the pair is back.
func TestMigrationRefusedWithPairNotStopped(t *testing.T) {
	src, dst, g, host := migPairs(t)
	src.s.StopPair(0)
	stuck := &loop{done: make(chan struct{})}
	close(stuck.done) // what waits for it at clean-up does not hang
	src.s.mu.Lock()
	src.s.stopping[stuck] = struct{}{}
	src.s.mu.Unlock()
	t.Cleanup(func() {
		src.s.mu.Lock()
		delete(src.s.stopping, stuck)
		src.s.mu.Unlock()
	})

	stopped := make(chan struct{})
	go func() { src.s.MigrationStopped(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("MigrationStopped with a pair not stopped did not return in 5 s")
	}
	var state bytes.Buffer
	saved := make(chan error, 1)
	go func() { saved <- src.s.SaveState(&state) }()
	select {
	case err := <-saved:
		if err == nil {
			t.Fatal("SaveState with a pair not stopped: no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("SaveState with a pair not stopped did not return in 5 s")
	}
	src.s.mig.mu.Lock()
	sent := src.s.mig.sent != nil
	src.s.mig.mu.Unlock()
	if sent {
		t.Fatal("the flows went to the destination with a pair not stopped")
	}
	dst.s.mig.mu.Lock()
	pending := len(dst.s.mig.pending)
	dst.s.mig.mu.Unlock()
	if pending != 0 || state.Len() != 0 {
		t.Fatalf("destination holds %d hand-overs, SaveState wrote %d bytes; want none", pending, state.Len())
	}

	src.s.mu.Lock()
	delete(src.s.stopping, stuck)
	src.s.mu.Unlock()
	src.restart()
	host.Write([]byte("still here"))
	g.until("data through the source", func(header.TCP) bool { return bytes.Equal(g.got, []byte("still here")) })
	if n := src.s.PairTCPStats(0).ConnsByState[stats.TCPEstablished].Load(); n != 1 {
		t.Fatalf("the source holds %d established connections, want 1", n)
	}
}

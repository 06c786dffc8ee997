package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"vunet/tcpstack"
	"vunet/tcpstack/header"
	"vunet/tcpstack/linksvc"
)

// streamTestStack is a Stack whose guest is 10.0.2.15/24 behind 10.0.2.2.
func streamTestStack(t *testing.T) *tcpstack.Stack {
	t.Helper()
	cfg := tcpstack.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cfg.Addr.IPv4.Addr = netip.MustParseAddr("10.0.2.15")
	cfg.Addr.IPv4.PrefixLen = 24
	cfg.Addr.IPv4.Gateway = netip.MustParseAddr("10.0.2.2")
	cfg.Addr.Disable6 = true
	s := tcpstack.New(cfg)
	t.Cleanup(s.Close)
	return s
}

// arpWho is an ARP request from the guest for the gateway, and its length prefix.
func arpWho() (lenPrefix, frame []byte) {
	f := make([]byte, 42)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	mac := []byte{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	copy(f[6:12], mac)
	binary.BigEndian.PutUint16(f[12:], uint16(header.EtherTypeARP))
	binary.BigEndian.PutUint16(f[14:], 1)
	binary.BigEndian.PutUint16(f[16:], uint16(header.EtherTypeIPv4))
	f[18], f[19] = 6, 4
	binary.BigEndian.PutUint16(f[20:], 1)
	copy(f[22:28], mac)
	copy(f[28:32], []byte{10, 0, 2, 15})
	copy(f[38:42], []byte{10, 0, 2, 2})
	return binary.BigEndian.AppendUint32(nil, uint32(len(f))), f
}

// answersARP sends an ARP request for the gateway on c and waits for the
// reply from our MAC: the connection is being served.
func answersARP(t *testing.T, c net.Conn) bool {
	t.Helper()
	l, f := arpWho()
	if _, err := c.Write(append(l, f...)); err != nil {
		return false
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		var lb [4]byte
		if _, err := io.ReadFull(c, lb[:]); err != nil {
			return false
		}
		fr := make([]byte, binary.BigEndian.Uint32(lb[:]))
		if _, err := io.ReadFull(c, fr); err != nil {
			return false
		}
		if binary.BigEndian.Uint16(fr[12:]) == uint16(header.EtherTypeARP) && binary.BigEndian.Uint16(fr[20:]) == 2 &&
			bytes.Equal(fr[6:12], linksvc.DefaultOurMAC[:]) {
			return true
		}
	}
}

func listenStreamTest(t *testing.T) (*net.UnixListener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stream.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	return l, path
}

// TestServeStreamListener: one front-end at a time (a second connection
// while one is served is closed at once, as passt does), the next one
// served when the first has gone, and the server returns when ctx ends.
func TestServeStreamListener(t *testing.T) {
	l, path := listenStreamTest(t)
	s := streamTestStack(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveStreamListener(ctx, l, s, false, slog.New(slog.NewTextHandler(io.Discard, nil))) }()

	first, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if !answersARP(t, first) {
		t.Fatal("the first front-end is not served")
	}
	second, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	second.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := second.Read(make([]byte, 64)); err != io.EOF {
		t.Fatalf("a second front-end meanwhile: read %d, %v; want it closed", n, err)
	}
	second.Close()
	first.Close()
	var third net.Conn
	deadline := time.Now().Add(5 * time.Second)
	for served := false; !served; {
		if time.Now().After(deadline) {
			t.Fatal("the next front-end is not served after the first left")
		}
		if third, err = net.Dial("unix", path); err != nil {
			t.Fatal(err)
		}
		// Until the first session's end is noticed, a new one is turned away.
		if served = answersARP(t, third); !served {
			third.Close()
			time.Sleep(20 * time.Millisecond)
		}
	}
	defer third.Close()
	if n := s.PairStats(0).Stream.Sessions.Load(); n < 2 {
		t.Fatalf("sessions %d", n)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serveStreamListener did not return after cancel")
	}
}

// TestServeStreamOneOff: with --one-off the server returns once its
// first front-end has gone, and a hostile length ends the session like a
// close does.
func TestServeStreamOneOff(t *testing.T) {
	l, path := listenStreamTest(t)
	s := streamTestStack(t)
	done := make(chan error, 1)
	go func() {
		done <- serveStreamListener(context.Background(), l, s, true, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !answersARP(t, c) {
		t.Fatal("not served")
	}
	c.Write([]byte{0xff, 0xff, 0xff, 0xff}) // a length no frame has
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("--one-off: the server did not return after its front-end was dropped")
	}
	if n := s.PairStats(0).Stream.BadLength.Load(); n != 1 {
		t.Fatalf("bad lengths counted %d", n)
	}
}

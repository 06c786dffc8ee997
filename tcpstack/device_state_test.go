package tcpstack

import (
	"bytes"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"vunet/tcpstack/handover"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// repairPairs sets up a source and a destination Stack sharing one
// TCP_REPAIR helper (run in-process; cmd/vunet-repair runs the same code),
// with a guest connection established through the source. Source and
// destination on one host stand for two hosts: the device-state path
// moves no socket, it makes a new one.
func repairPairs(t *testing.T) (src, dst *testPair, g *migGuest, host net.Conn) {
	t.Helper()
	testenv.NeedRoot(t, "TCP_REPAIR needs CAP_NET_ADMIN (through the helper)")
	ln, accepted := hostListener(t)
	path := filepath.Join(t.TempDir(), "repair.sock")
	h, err := hostsock.ListenRepair(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	hc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hc.Close() })
	go hostsock.ServeRepair(hc)

	src, dst = newFlowPair(t, featMrg, nil), newFlowPair(t, featMrg, nil)
	src.s.SetRepairHelper(h)
	dst.s.SetRepairHelper(h)
	g, host = connectThrough(t, src, dst, ln, accepted, 45100, 5000)
	return src, dst, g, host
}

// TestDeviceStateMovesConnection: the source saves its state with the
// pair stopped (the connection read out of its socket in repair mode,
// data the peer sent meanwhile included), the destination loads it into a
// new socket, and the connection goes on from there both ways; the peer
// never sees a reset.
func TestDeviceStateMovesConnection(t *testing.T) {
	src, dst, g, host := repairPairs(t)
	exchangeBefore(t, g, host)

	src.s.StopPair(0)
	host.Write([]byte("queued "))
	time.Sleep(50 * time.Millisecond) // in the source socket's receive queue
	var state bytes.Buffer
	if err := src.s.SaveState(&state); err != nil {
		t.Fatal(err)
	}
	if n := src.s.PairTCPStats(0).ConnsByState[stats.TCPEstablished].Load(); n != 0 {
		t.Fatalf("the source still holds %d connections", n)
	}
	if err := dst.s.LoadState(&state); err != nil {
		t.Fatal(err)
	}
	if n := dst.s.PairTCPStats(0).ConnsByState[stats.TCPEstablished].Load(); n != 1 {
		t.Fatalf("the destination made %d connections", n)
	}
	g.p = dst
	dst.start()
	host.Write([]byte("after"))
	g.until("the rest", func(header.TCP) bool { return bytes.Equal(g.got, []byte("before queued after")) })
	g.send(header.TCPFlagACK|header.TCPFlagPSH, []byte("up2"))
	if s := readFull(t, host, 3); s != "up2" {
		t.Fatalf("host got %q", s)
	}
	// The guest closes: the peer sees the FIN, not a reset.
	g.send(header.TCPFlagFIN|header.TCPFlagACK, nil)
	host.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := host.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("host read after the guest's FIN: %d, %v; want EOF", n, err)
	}
}

// TestDeviceStateFailedMigration: the state was saved (the sockets closed)
// and the rings start at the source again: the source makes its
// connections again from what it saved.
func TestDeviceStateFailedMigration(t *testing.T) {
	src, _, g, host := repairPairs(t)
	src.s.StopPair(0)
	if err := src.s.SaveState(io.Discard); err != nil {
		t.Fatal(err)
	}
	src.restart()
	if n := src.s.PairTCPStats(0).ConnsByState[stats.TCPEstablished].Load(); n != 1 {
		t.Fatalf("the source holds %d connections after resuming", n)
	}
	host.Write([]byte("still here"))
	g.until("data through the source", func(header.TCP) bool { return bytes.Equal(g.got, []byte("still here")) })
	g.send(header.TCPFlagACK|header.TCPFlagPSH, []byte("up"))
	if s := readFull(t, host, 2); s != "up" {
		t.Fatalf("host got %q", s)
	}
}

// TestDeviceStateWithoutHelper: with no TCP_REPAIR helper the state says
// nothing of the connection, which stays with the source.
func TestDeviceStateWithoutHelper(t *testing.T) {
	_, dst, g, host := migPairs(t) // a hand-over channel, unused here
	_ = dst
	src := g.p
	src.s.StopPair(0)
	src.s.mig.mu.Lock()
	src.s.mig.dest = nil // no same-host destination either
	src.s.mig.mu.Unlock()
	var state bytes.Buffer
	if err := src.s.SaveState(&state); err != nil {
		t.Fatal(err)
	}
	src.restart()
	host.Write([]byte("x"))
	g.until("data through the source", func(header.TCP) bool { return bytes.Equal(g.got, []byte("x")) })
	items, err := handover.ReadStream(bytes.NewReader(state.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.Kind == handover.KindTCP {
			t.Fatalf("the state carries a TCP connection (pair %d) with no helper to restore it", it.Pair)
		}
	}
	if err := dst.s.LoadState(&state); err != nil {
		t.Fatal(err)
	}
}

// TestDeviceStatePairOutOfRange: a connection item for a pair number past
// any device's is refused before a socket or a pair's tables are made for
// it (the stream comes from another host).
func TestDeviceStatePairOutOfRange(t *testing.T) {
	src, dst, _, _ := repairPairs(t)
	src.s.StopPair(0)
	var state bytes.Buffer
	if err := src.s.SaveState(&state); err != nil {
		t.Fatal(err)
	}
	items, err := handover.ReadStream(&state)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := range items {
		if items[i].Kind == handover.KindTCP {
			items[i].Pair = 300
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d connection items saved, want 1", n)
	}
	var bad bytes.Buffer
	if err := handover.WriteStream(&bad, items); err != nil {
		t.Fatal(err)
	}
	if err := dst.s.LoadState(&bad); err != nil {
		t.Fatal(err)
	}
	dst.s.mu.Lock()
	ps := dst.s.pairs[300]
	dst.s.mu.Unlock()
	if ps != nil {
		t.Fatal("pair 300's tables were made for a connection item")
	}
}

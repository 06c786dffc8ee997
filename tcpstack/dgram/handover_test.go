package dgram

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/stats"
)

// loopbackUDP is a UDP socket on 127.0.0.1 for a test's host peer, closed
// when the test ends.
func loopbackUDP(tb testing.TB) *net.UDPConn {
	tb.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// udpSocketTo returns a UDP socket connected to addr, as a flow holds one.
func udpSocketTo(t testing.TB, addr *net.UDPAddr) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	sa := &unix.SockaddrInet4{Port: addr.Port}
	copy(sa.Addr[:], addr.IP.To4())
	if err := unix.Connect(fd, sa); err != nil {
		t.Fatal(err)
	}
	return fd
}

func newTestTable(n int) *Table {
	return New(Config{MaxFlows: n, UDPTimeout: time.Minute, ICMPTimeout: time.Minute}, new(stats.Queue))
}

func v4Key(guestPort, remotePort uint16) flowKey {
	k := flowKey{kind: flowUDP, guestPort: guestPort, remotePort: remotePort}
	copy(k.guestIP[:], []byte{10, 0, 2, 15})
	copy(k.remoteIP[:], []byte{10, 0, 2, 2})
	return k
}

// TestHandOverKeepsFlow moves a UDP flow between two tables: the new table
// has the flow under its key with its age, the socket is the same (a
// datagram the server sends to the flow's host port after the hand-over is
// read through the new descriptor), and the old table forgot it without
// touching the socket.
func TestHandOverKeepsFlow(t *testing.T) {
	srv := loopbackUDP(t)
	src, dst := newTestTable(4), newTestTable(4)
	now := time.Unix(1_000_000, 0)
	src.now = now.Add(-20 * time.Second)
	key := v4Key(5353, 53)
	fd := udpSocketTo(t, srv.LocalAddr().(*net.UDPAddr))
	if _, ok := src.adopt(&key, fd); !ok {
		t.Fatal("adopt")
	}
	if _, err := unix.Write(fd, []byte("query")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_, peer, err := srv.ReadFromUDP(buf)
	if err != nil {
		t.Fatal(err)
	}

	ex := src.Export(now)
	if len(ex) != 1 || ex[0].FD != fd {
		t.Fatalf("exported %+v", ex)
	}
	later := now.Add(time.Hour)
	dfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.Import(later, ex[0].State, dfd); err != nil {
		t.Fatal(err)
	}
	if n := src.Forget(ex); n != 1 || src.live != 0 {
		t.Fatalf("Forget dropped %d, %d flows left", n, src.live)
	}
	i, ok := dst.byKey[key]
	if !ok || dst.flows[i].fd != dfd || !dst.flows[i].lastUsed.Equal(later.Add(-20*time.Second)) {
		t.Fatalf("imported flow %+v", dst.flows[i])
	}
	// The answer to the query, sent to the same host port, is there.
	if _, err := srv.WriteToUDP([]byte("answer"), peer); err != nil {
		t.Fatal(err)
	}
	unix.SetNonblock(dfd, false)
	unix.SetsockoptTimeval(dfd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	n, err := unix.Read(dfd, buf)
	if err != nil || string(buf[:n]) != "answer" {
		t.Fatalf("read through the new descriptor: %q, %v", buf[:n], err)
	}
	dst.CloseFlows()
}

// TestImportFlowHostile refuses states and descriptors no flow has.
func TestImportFlowHostile(t *testing.T) {
	srv := loopbackUDP(t)
	src := newTestTable(4)
	now := time.Unix(1_000_000, 0)
	src.now = now
	key := v4Key(5353, 53)
	udp := udpSocketTo(t, srv.LocalAddr().(*net.UDPAddr))
	if _, ok := src.adopt(&key, udp); !ok {
		t.Fatal("adopt")
	}
	defer src.CloseFlows()
	good := src.Export(now)[0].State
	mutate := func(fn func(w *flowWire)) []byte {
		var w flowWire
		if _, err := binary.Decode(good, binary.LittleEndian, &w); err != nil {
			t.Fatal(err)
		}
		fn(&w)
		b, _ := binary.Append(nil, binary.LittleEndian, &w)
		return b
	}
	tcpfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tcpfd)
	dst := newTestTable(1)
	cases := []struct {
		name  string
		state []byte
		fd    int
		want  error
	}{
		{"short", good[:10], udp, ErrImportState},
		{"version", mutate(func(w *flowWire) { w.Version = 9 }), udp, ErrImportState},
		{"kind", mutate(func(w *flowWire) { w.Kind = 7 }), udp, ErrImportState},
		{"port 0", mutate(func(w *flowWire) { w.RemotePort = 0 }), udp, ErrImportState},
		{"junk in an IPv4 address", mutate(func(w *flowWire) { w.GuestIP[9] = 1 }), udp, ErrImportState},
		{"unspecified", mutate(func(w *flowWire) { w.RemoteIP = [16]byte{} }), udp, ErrImportState},
		{"echo flow on a UDP socket", mutate(func(w *flowWire) { w.Kind, w.RemotePort = uint8(flowICMP), 0 }), udp, ErrImportState},
		{"TCP socket", good, tcpfd, ErrImportState},
		{"no socket", good, -1, ErrImportState},
	}
	for _, c := range cases {
		if err := dst.Import(now, c.state, c.fd); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if dst.live != 0 {
		t.Fatal("a refused import left a flow")
	}
	// The table full, or attached to a loop: refused too.
	dup := func() int {
		fd, err := unix.Dup(udp)
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	if err := dst.Import(now, good, dup()); err != nil {
		t.Fatal(err)
	}
	other := mutate(func(w *flowWire) { w.GuestPort = 5354 })
	fd := dup()
	if err := dst.Import(now, other, fd); !errors.Is(err, ErrImportTaken) {
		t.Errorf("full table: %v", err)
	}
	unix.Close(fd)
	if _, err := unix.FcntlInt(uintptr(udp), unix.F_GETFD, 0); err != nil {
		t.Error("the source's socket was closed by a refused import")
	}
	dst.CloseFlows()
}

// FuzzImportFlow: any bytes are refused or make a flow, never a panic.
func FuzzImportFlow(f *testing.F) {
	// IPv4 addresses take the first four bytes.
	w := flowWire{Version: flowStateVersion, Kind: uint8(flowUDP), GuestPort: 1, RemotePort: 2,
		GuestIP: [16]byte{10, 0, 2, 15}, RemoteIP: [16]byte{10, 0, 2, 2}}
	seed, _ := binary.Append(nil, binary.LittleEndian, &w)
	f.Add(seed)
	srv := loopbackUDP(f)
	udp := udpSocketTo(f, srv.LocalAddr().(*net.UDPAddr))
	f.Cleanup(func() { unix.Close(udp) })
	f.Fuzz(func(t *testing.T, state []byte) {
		tab := newTestTable(2)
		fd, err := unix.Dup(udp)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_000_000, 0)
		if err := tab.Import(now, state, fd); err != nil {
			unix.Close(fd)
			if tab.live != 0 {
				t.Fatal("refused import left a flow")
			}
			return
		}
		tab.Expire(now.Add(time.Hour))
		if n := tab.Forget(tab.Export(now)); n > 1 {
			t.Fatalf("forgot %d", n)
		}
		tab.CloseFlows()
	})
}

// TestHandOverKeepsDNSForward: a UDP flow to the DNS forward is still
// one after a hand-over (its datagrams keep being counted as queries).
func TestHandOverKeepsDNSForward(t *testing.T) {
	srv := loopbackUDP(t)
	pol := addrpolicy.New(addrpolicy.Config{Guest4: netip.MustParsePrefix("10.0.2.15/24"),
		Gateway4: netip.MustParseAddr("10.0.2.2"), MapGateway: true, DNSForward4: netip.MustParseAddr("127.0.0.1")})
	cfg := Config{MaxFlows: 4, UDPTimeout: time.Minute, ICMPTimeout: time.Minute, Policy: pol}
	src, dst := New(cfg, new(stats.Queue)), New(cfg, new(stats.Queue))
	now := time.Unix(1_000_000, 0)
	for _, c := range []struct {
		remotePort uint16
		dns        bool
	}{{53, true}, {80, false}} {
		key := v4Key(5353, c.remotePort)
		fd := udpSocketTo(t, srv.LocalAddr().(*net.UDPAddr))
		if _, ok := src.adopt(&key, fd); !ok {
			t.Fatal("adopt")
		}
		ex := src.Export(now)
		dfd, err := unix.FcntlInt(uintptr(ex[0].FD), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := dst.Import(now, ex[0].State, dfd); err != nil {
			t.Fatal(err)
		}
		src.Forget(ex)
		if i, ok := dst.byKey[key]; !ok || dst.flows[i].dns != c.dns {
			t.Errorf("port %d: imported flow's DNS forward %v, want %v", c.remotePort, ok && dst.flows[i].dns, c.dns)
		}
	}
}

// HandOff's encoding fills the caller's buffer (StateSize bytes, which the
// package's init checks against the encoding), allocating nothing.
func TestStateSize(t *testing.T) {
	var f flow
	var buf [StateSize]byte
	if n := testing.AllocsPerRun(100, func() {
		b, err := encodeFlow(time.Unix(1, 0), &f, buf[:0])
		if err != nil || len(b) != StateSize || &b[0] != &buf[0] {
			t.Fatalf("encodeFlow: %d bytes, %v, in the caller's buffer: %v", len(b), err, len(b) > 0 && &b[0] == &buf[0])
		}
	}); n != 0 {
		t.Fatalf("encodeFlow into a buffer with room: %v allocations", n)
	}
}

package hostsock

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/testenv"
)

// startHelper runs the helper's side in-process, connected to the
// daemon's socket at path (cmd/vunet-repair runs the same function).
func startHelper(t *testing.T, path string) {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go ServeRepair(c)
}

// connPair returns a connected socket (the "vunet" end, a raw descriptor)
// and its peer (the host's other end) on loopback; the peer's receive
// buffer is small, so data the vunet end writes stays in its send queue.
func connPair(t *testing.T) (fd int, peer *net.TCPConn) {
	t.Helper()
	lc := net.ListenConfig{}
	ln, err := lc.Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		testenv.Unavailable(t, err, "a loopback interface")
	}
	defer ln.Close()
	rc, _ := ln.(*net.TCPListener).SyscallConn()
	rc.Control(func(s uintptr) { unix.SetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	bindOutsideEphemeral(t, fd)
	addr := ln.Addr().(*net.TCPAddr)
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: addr.Port}); err != nil {
		t.Fatal(err)
	}
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	unix.SetNonblock(fd, true)
	return fd, c.(*net.TCPConn)
}

// bindOutsideEphemeral binds fd to a free loopback port below the
// kernel's ephemeral range. The restore binds the connection's local port
// again after the old socket closed; an ephemeral port could meanwhile be
// taken by any connect() on the machine (other packages' tests run at the
// same time) and the bind then fails, which is not what the test is about.
func bindOutsideEphemeral(t *testing.T, fd int) {
	t.Helper()
	lo, hi := 10000, 30000 // ports lo to hi-1; below Linux's default 32768-60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var first, last int
		if _, err := fmt.Sscan(string(b), &first, &last); err == nil && first < hi {
			hi = first
		}
	}
	if hi-lo < 100 {
		// connect() picks an ephemeral port, as before: the test runs,
		// only open to the race above.
		t.Logf("ephemeral ports start at %d: the connection takes one of them", hi)
		return
	}
	start := rand.IntN(hi - lo)
	for i := range hi - lo {
		port := lo + (start+i)%(hi-lo)
		err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port})
		if err == nil {
			return
		}
		if err != unix.EADDRINUSE {
			t.Fatalf("bind 127.0.0.1:%d: %v", port, err)
		}
	}
	t.Fatalf("no free loopback port in %d-%d", lo, hi-1)
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// TestRepairMovesConnection reads a live connection out of its socket and
// makes it again in a new one, as a migration does across hosts: data the
// peer sent that nobody read yet, data written that the peer has not
// taken, the peek offset, all go on in the new socket, and the peer sees
// neither a FIN nor a reset.
func TestRepairMovesConnection(t *testing.T) {
	testenv.NeedRoot(t, "TCP_REPAIR needs CAP_NET_ADMIN (through the helper)")
	path := filepath.Join(t.TempDir(), "repair.sock")
	h, err := ListenRepair(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	startHelper(t, path)

	fd, peer := connPair(t)
	down := pattern(3000, 1)
	if _, err := peer.Write(down); err != nil {
		t.Fatal(err)
	}
	// Wait for it, peek part of it as vunet does (SO_PEEK_OFF).
	deadline := time.Now().Add(5 * time.Second)
	for n, _ := unix.IoctlGetInt(fd, unix.SIOCINQ); n < len(down); n, _ = unix.IoctlGetInt(fd, unix.SIOCINQ) {
		if time.Now().After(deadline) {
			t.Fatal("data never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, 0); err != nil {
		t.Skipf("SO_PEEK_OFF: %v", err)
	}
	if n, _, err := unix.Recvfrom(fd, make([]byte, 1000), unix.MSG_PEEK); err != nil || n != 1000 {
		t.Fatalf("peek: %d %v", n, err)
	}
	// Fill the peer's small window: the rest stays in our send queue.
	up := pattern(200000, 9)
	sent := 0
	for sent < len(up) {
		n, err := unix.Write(fd, up[sent:])
		if err != nil {
			break
		}
		sent += n
	}
	if q, _ := unix.IoctlGetInt(fd, unix.SIOCOUTQ); q == 0 {
		t.Fatal("nothing left in the send queue")
	}

	if err := h.Set([]int{fd}, RepairOn); err != nil {
		t.Fatal(err)
	}
	st, err := DumpTCP(fd)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.RecvQueue) != len(down) || st.PeekOff != 1000 || len(st.SendQueue) == 0 || st.MSS == 0 {
		t.Fatalf("dump: recv %d bytes, send %d, peek %d, mss %d", len(st.RecvQueue), len(st.SendQueue), st.PeekOff, st.MSS)
	}
	// Closed in repair mode: silently; the port is free for the new one.
	unix.Close(fd)
	nfd, err := RestoreTCP(st, func(fd int) error { return h.Set([]int{fd}, RepairOn) })
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(nfd)
	if err := h.Set([]int{nfd}, RepairOff); err != nil {
		t.Fatal(err)
	}
	if off, _ := unix.GetsockoptInt(nfd, unix.SOL_SOCKET, unix.SO_PEEK_OFF); off != 1000 {
		t.Errorf("peek offset %d after the restore, want 1000", off)
	}
	// The peer reads everything written, in order, then more.
	go func() {
		time.Sleep(10 * time.Millisecond)
		unix.SetNonblock(nfd, false)
		unix.Write(nfd, up[sent:])
	}()
	peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(up))
	if _, err := io.ReadFull(peer, got); err != nil || !bytes.Equal(got, up) {
		t.Fatalf("peer read %v; equal %v", err, bytes.Equal(got, up))
	}
	// We read what the peer sent before the move, then what it sends now.
	unix.SetsockoptInt(nfd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, -1)
	more := []byte("after the move")
	if _, err := peer.Write(more); err != nil {
		t.Fatalf("peer write after the move: %v", err)
	}
	want := append(append([]byte(nil), down...), more...)
	unix.SetsockoptTimeval(nfd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	var all []byte
	buf := make([]byte, 8192)
	for len(all) < len(want) {
		n, err := unix.Read(nfd, buf)
		if err != nil || n == 0 {
			t.Fatalf("read after %d bytes: %d %v", len(all), n, err)
		}
		all = append(all, buf[:n]...)
	}
	if !bytes.Equal(all, want) {
		t.Fatal("data through the new socket differs")
	}
}

// TestRepairHelperMissing: without a helper, Set fails in bounded time.
func TestRepairHelperMissing(t *testing.T) {
	h, err := ListenRepair(filepath.Join(t.TempDir(), "repair.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	start := time.Now()
	fd, _ := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	defer unix.Close(fd)
	if err := h.Set([]int{fd}, RepairOn); err == nil {
		t.Fatal("Set without a helper")
	}
	if d := time.Since(start); d > RepairHelperWait+2*time.Second {
		t.Errorf("took %v", d)
	}
}

// FuzzRepairState: any bytes decode to a checked state or an error, and a
// decoded state encodes back to the same bytes.
func FuzzRepairState(f *testing.F) {
	st := &TCPRepairState{Local: netip.MustParseAddrPort("10.0.0.1:1234"), Remote: netip.MustParseAddrPort("10.0.0.2:80"),
		SendSeq: 7, RecvSeq: 9, MSS: 1460, SndWscale: 7, RcvWscale: 9, Timestamps: true, SACK: true, Wscale: true,
		TSVal: 12345, PeekOff: 100, SendQueue: []byte("abc"), RecvQueue: []byte("defg")}
	b, err := st.MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var st TCPRepairState
		if err := st.UnmarshalBinary(b); err != nil {
			return
		}
		if len(st.SendQueue) > MaxRepairQueue || st.MSS == 0 || st.SndWscale > 14 {
			t.Fatalf("unchecked state %+v", st)
		}
		re, err := st.MarshalBinary()
		if err != nil || !bytes.Equal(re, b) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}

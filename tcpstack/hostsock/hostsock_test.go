package hostsock

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestToken(t *testing.T) {
	for _, tc := range []struct {
		o         Owner
		gen, slot uint32
	}{{OwnerLoop, 0, 3}, {OwnerTCP, 1<<24 + 5, 1<<32 - 1}, {OwnerUDPForward, GenMask, 0}} {
		tok := NewToken(tc.o, tc.gen, tc.slot)
		if tok.Owner() != tc.o || tok.Gen() != tc.gen&GenMask || tok.Slot() != tc.slot {
			t.Errorf("%+v: owner %d gen %d slot %d", tc, tok.Owner(), tok.Gen(), tok.Slot())
		}
		// Through epoll and back.
		ep, err := NewEpoll()
		if err != nil {
			t.Fatal(err)
		}
		efd, _ := unix.Eventfd(1, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err := ep.Add(efd, unix.EPOLLIN, tok); err != nil {
			t.Fatal(err)
		}
		var evs [1]unix.EpollEvent
		if n, err := ep.Wait(evs[:], 1000); n != 1 || err != nil || EventToken(&evs[0]) != tok {
			t.Errorf("epoll returned %d %v %#x, want %#x", n, err, EventToken(&evs[0]), tok)
		}
		unix.Close(efd)
		ep.Close()
	}
}

func socketPair(t *testing.T, typ int) (a, b int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

// TestIOOffsetsAndSplits: Send takes exactly bytes [off, off+n) of the
// concatenated buffers, whatever their split; Recv and Peek fill split
// buffers in order; Peek leaves the bytes queued.
func TestIOOffsetsAndSplits(t *testing.T) {
	a, b := tcpPair(t)
	var s IO
	data := []byte("0123456789abcdefghij")
	bufs := [][]byte{data[:3], nil, data[3:4], data[4:11], data[11:]}
	for _, tc := range []struct{ off, n int }{{0, 20}, {2, 5}, {3, 1}, {10, 10}, {19, 1}, {5, 0}} {
		n, err := s.Send(a, bufs, tc.off, tc.n)
		if err != nil || n != tc.n {
			t.Fatalf("send %+v: %d %v", tc, n, err)
		}
		if tc.n == 0 {
			continue
		}
		p1, p2 := make([]byte, 1), make([]byte, 64)
		unix.Poll([]unix.PollFd{{Fd: int32(b), Events: unix.POLLIN}}, 2000)
		got, err := s.Peek(b, [][]byte{p1, p2})
		if err != nil || got != tc.n || !bytes.Equal(append(p1, p2[:got-1]...), data[tc.off:tc.off+tc.n]) {
			t.Fatalf("peek %+v: %d %v %q%q", tc, got, err, p1, p2[:max(got-1, 0)])
		}
		r1, r2 := make([]byte, 2), make([]byte, 64)
		got, _, err = s.Recv(b, [][]byte{r1, r2}, 0)
		if err != nil || got != tc.n || !bytes.Equal(append(r1, r2...)[:got], data[tc.off:tc.off+tc.n]) {
			t.Fatalf("recv %+v: %d %v", tc, got, err)
		}
	}
	if n, err := s.Peek(b, nil); n != 0 || err != nil {
		t.Errorf("peek into nothing: %d %v", n, err)
	}
	if _, _, err := s.Recv(b, [][]byte{make([]byte, 4)}, 0); !errors.Is(err, unix.EAGAIN) {
		t.Errorf("recv on empty socket: %v, want EAGAIN", err)
	}
	// Discard drops from the front without copying.
	s.Send(a, [][]byte{data}, 0, len(data))
	unix.Poll([]unix.PollFd{{Fd: int32(b), Events: unix.POLLIN}}, 2000)
	if n, err := Discard(b, 5); n != 5 || err != nil {
		t.Fatalf("discard: %d %v", n, err)
	}
	r := make([]byte, 64)
	n, _, _ := s.Recv(b, [][]byte{r}, 0)
	if string(r[:n]) != string(data[5:]) {
		t.Errorf("after discard %q", r[:n])
	}
}

// tcpPair returns a connected loopback TCP pair.
func tcpPair(t *testing.T) (a, b int) {
	t.Helper()
	l, port, err := ListenTCP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(l)
	a, _, err = DialTCP(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), Source{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Poll([]unix.PollFd{{Fd: int32(l), Events: unix.POLLIN}}, 2000)
	b, _, err = Accept(l)
	if err != nil {
		t.Fatal(err)
	}
	unix.Poll([]unix.PollFd{{Fd: int32(a), Events: unix.POLLOUT}}, 2000)
	t.Cleanup(func() { unix.Close(a); unix.Close(b) })
	return a, b
}

func TestIODoesNotAllocate(t *testing.T) {
	a, b := socketPair(t, unix.SOCK_DGRAM)
	var s IO
	out := [][]byte{make([]byte, 700), make([]byte, 801)}
	in := [][]byte{make([]byte, 1000), make([]byte, 1000)}
	var from unix.RawSockaddrAny
	allocs := testing.AllocsPerRun(100, func() {
		s.Send(a, out, 1, 1400)
		s.Recv(b, in, 0)
		s.Send(a, out, 0, 10)
		s.RecvFrom(b, in, &from)
		s.Recv(b, in, 0) // EAGAIN
	})
	if allocs != 0 {
		t.Errorf("%v allocs per round", allocs)
	}
}

func TestDialListenAccept(t *testing.T) {
	fd, port, err := ListenTCP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if port == 0 {
		t.Fatal("no port")
	}
	c, inProgress, err := DialTCP(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port),
		Source{V4: netip.MustParseAddr("127.0.0.2")}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(c)
	if inProgress {
		pfd := []unix.PollFd{{Fd: int32(c), Events: unix.POLLOUT}}
		unix.Poll(pfd, 2000)
	}
	if v, err := GetInt(c, unix.IPPROTO_TCP, unix.TCP_NODELAY); err != nil || v == 0 {
		t.Errorf("TCP_NODELAY %d %v", v, err)
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	unix.Poll(pfd, 2000)
	a, peer, err := Accept(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(a)
	if peer.Addr() != netip.MustParseAddr("127.0.0.2") {
		t.Errorf("peer %v: the outbound source was not bound", peer)
	}
	var info unix.TCPInfo
	if !TCPInfo(a, &info) || info.State != 1 /* ESTABLISHED */ {
		t.Errorf("TCP_INFO state %d", info.State)
	}
	if _, _, ok := SendMemory(a); !ok {
		t.Errorf("SO_MEMINFO unreadable")
	}
	CloseWithReset(c)
	buf := make([]byte, 1)
	unix.Poll([]unix.PollFd{{Fd: int32(a), Events: unix.POLLIN}}, 2000)
	if _, err := unix.Read(a, buf); !errors.Is(err, unix.ECONNRESET) {
		t.Errorf("read after CloseWithReset: %v, want ECONNRESET", err)
	}
}

// TestDialAddresses: the raw connect reaches the address and port it was
// given in both families (the port in network byte order, an IPv4 address
// as AF_INET), reports the kernel's errors as unix.Errno values, and
// allocates nothing.
func TestDialAddresses(t *testing.T) {
	for _, dst := range []string{"127.0.0.1:4242", "[::1]:4243", "127.0.0.2:65534"} {
		ap := netip.MustParseAddrPort(dst)
		fd, err := DialDatagram(ap, 0, Source{})
		if err != nil {
			t.Fatalf("%s: %v", dst, err)
		}
		sa, err := unix.Getpeername(fd)
		unix.Close(fd)
		if err != nil {
			t.Fatalf("%s: getpeername: %v", dst, err)
		}
		var got netip.AddrPort
		switch sa := sa.(type) {
		case *unix.SockaddrInet4:
			got = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
		case *unix.SockaddrInet6:
			got = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
		}
		if got != ap {
			t.Errorf("connected to %v, want %v", got, ap)
		}
	}
	// A TCP connect to a port nobody listens on: refused, as an Errno.
	fd, _, err := DialTCP(netip.MustParseAddrPort("[::1]:1"), Source{}, 0, 0)
	if err == nil {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		unix.Poll(pfd, 2000)
		err = unix.Errno(0)
		if v, gerr := GetInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); gerr == nil {
			err = unix.Errno(v)
		}
		unix.Close(fd)
	}
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("connect to [::1]:1: %v, want ECONNREFUSED", err)
	}
	if err := connect(-1, netip.MustParseAddrPort("127.0.0.1:1")); err != unix.EBADF {
		t.Errorf("connect on fd -1: %v, want EBADF", err)
	}
	s, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(s)
	ap := netip.MustParseAddrPort("[::1]:4244")
	if allocs := testing.AllocsPerRun(100, func() { connect(s, ap) }); allocs != 0 {
		t.Errorf("%v allocs per connect", allocs)
	}
}

// TestForwardUDP: a forwarded port's reply socket shares its port and
// reaches the peer from it; RecvFrom reports the sender.
func TestForwardUDP(t *testing.T) {
	lfd, local, port, err := ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(lfd)
	peer, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	pap := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	if _, err := peer.WriteToUDPAddrPort([]byte("ping"), netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)); err != nil {
		t.Fatal(err)
	}
	unix.Poll([]unix.PollFd{{Fd: int32(lfd), Events: unix.POLLIN}}, 2000)
	if n, err := NextDatagram(lfd); n != 4 || err != nil {
		t.Errorf("next datagram %d %v", n, err)
	}
	var s IO
	var from unix.RawSockaddrAny
	buf := make([]byte, 16)
	n, _, err := s.RecvFrom(lfd, [][]byte{buf}, &from)
	got, ok := RawAddrPort(&from)
	if err != nil || n != 4 || !ok || got != pap {
		t.Fatalf("recvfrom %d %v from %v, want %v", n, err, got, pap)
	}
	r, err := DialUDPFrom(local, pap, "")
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(r)
	s.Send(r, [][]byte{[]byte("pong")}, 0, 4)
	b := make([]byte, 16)
	m, src, err := peer.ReadFromUDPAddrPort(b)
	if err != nil || string(b[:m]) != "pong" || src.Port() != port {
		t.Errorf("peer got %q from %v, want pong from port %d", b[:m], src, port)
	}
}

// TestSocketKind: the type and protocol of sockets of each kind a flow
// holds, and an error for a descriptor that is no socket.
func TestSocketKind(t *testing.T) {
	for _, tc := range []struct {
		typ, proto int
	}{{unix.SOCK_STREAM, unix.IPPROTO_TCP}, {unix.SOCK_DGRAM, unix.IPPROTO_UDP}} {
		fd, err := unix.Socket(unix.AF_INET, tc.typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		typ, proto, err := SocketKind(fd)
		unix.Close(fd)
		if err != nil || typ != tc.typ || proto != tc.proto {
			t.Errorf("socket(%d): type %d protocol %d, err %v; want %d %d", tc.typ, typ, proto, err, tc.typ, tc.proto)
		}
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, _, err := SocketKind(p[0]); !errors.Is(err, unix.ENOTSOCK) {
		t.Errorf("pipe: err %v, want ENOTSOCK", err)
	}
}

// TestSlots: a freed slot holds what Free put there until the next Add
// takes it; the other records keep their slots.
func TestSlots(t *testing.T) {
	var s Slots[string]
	a, b, c := s.Add("a"), s.Add("b"), s.Add("c")
	if a != 0 || b != 1 || c != 2 || s.Len() != 3 {
		t.Fatalf("slots %d %d %d, len %d", a, b, c, s.Len())
	}
	s.Free(b, "")
	if s.Len() != 2 || s.All[b] != "" {
		t.Fatalf("after Free: len %d, slot %d holds %q", s.Len(), b, s.All[b])
	}
	if d := s.Add("d"); d != b || s.Len() != 3 {
		t.Fatalf("Add after Free took slot %d (len %d), want the freed %d", d, s.Len(), b)
	}
	if e := s.Add("e"); e != 3 {
		t.Fatalf("Add with none free took slot %d, want 3", e)
	}
	if got := strings.Join(s.All, ","); got != "a,d,c,e" {
		t.Fatalf("records %q", got)
	}
}

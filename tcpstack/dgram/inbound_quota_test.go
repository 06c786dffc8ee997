package dgram

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/guestring"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// fakeSink is a guest RX ring with room for every frame, or a disabled one.
type fakeSink struct {
	disabled bool
	hdr      [128]byte
	pay      [65536]byte
	iov      [1][]byte
	frames   int
}

func (s *fakeSink) Reserve(hdrLen, maxPayload int) ([]byte, [][]byte, guestring.Status) {
	s.iov[0] = s.pay[:min(maxPayload, len(s.pay))]
	return s.hdr[:hdrLen], s.iov[:], guestring.OK
}
func (s *fakeSink) Commit(int, *virtqueue.NetHdr) { s.frames++ }
func (s *fakeSink) Abort()                        {}
func (s *fakeSink) Enabled() bool                 { return !s.disabled }
func (s *fakeSink) MoreLater() bool               { return false }
func (s *fakeSink) Merging() bool                 { return false }

// forwardTable is a table with a forwarded UDP port on the loopback for a
// guest at 10.0.2.15 behind 10.0.2.2 (loopback peers appear as the
// gateway); it returns the table and the port's address.
func forwardTable(t *testing.T, cfg Config) (*Table, *net.UDPAddr) {
	t.Helper()
	cfg.UDPTimeout, cfg.ICMPTimeout = time.Minute, time.Minute
	cfg.Guest4 = netip.MustParseAddr("10.0.2.15")
	cfg.Policy = addrpolicy.New(addrpolicy.Config{
		Guest4:     netip.MustParsePrefix("10.0.2.15/24"),
		Gateway4:   netip.MustParseAddr("10.0.2.2"),
		MapGateway: true,
	})
	ft := New(cfg, new(stats.Queue))
	t.Cleanup(ft.Close)
	_, port, err := ft.Listen(netip.MustParseAddrPort("127.0.0.1:0"), "", 53)
	if err != nil {
		t.Fatal(err)
	}
	return ft, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(port)}
}

// flushAll runs Flush with the forwarded port marked readable until it
// reports no work left.
func flushAll(t *testing.T, ft *Table, now time.Time, w guestring.Sink) (rounds int) {
	t.Helper()
	ft.Ready(hostsock.NewToken(hostsock.OwnerUDPForward, 0, 0))
	for rounds = 1; ft.Flush(now, w); rounds++ {
		if rounds > 10000 {
			t.Fatal("Flush keeps reporting work")
		}
	}
	return rounds
}

// TestInboundFlowsSpareGuestFlows: remote peers sending to a forwarded UDP
// port from many source ports each open a flow (the guest's replies leave
// from the forwarded port); they must push out only each other, never the
// flows the guest opened itself (its DNS queries), however many they are.
func TestInboundFlowsSpareGuestFlows(t *testing.T) {
	const maxFlows, guestFlows, peers = 8, 3, 200
	ft, fwd := forwardTable(t, Config{MaxFlows: maxFlows})
	srv := loopbackUDP(t)
	start := time.Unix(1_000_000, 0)
	// The guest's own flows, used before the flood: the least recently
	// used in the table.
	ft.now = start
	guest := map[flowKey]int{}
	for i := range guestFlows {
		k := v4Key(uint16(5000+i), 53)
		fd := udpSocketTo(t, srv.LocalAddr().(*net.UDPAddr))
		if _, ok := ft.adopt(&k, fd); !ok {
			t.Fatal("adopt")
		}
		guest[k] = fd
	}
	// The flood: one datagram from each of many source ports. The
	// sockets stay open, so no port is taken twice (a reused port is one
	// flow for two datagrams, one eviction fewer than counted below).
	for range peers {
		if _, err := loopbackUDP(t).WriteToUDP([]byte("q"), fwd); err != nil {
			t.Fatal(err)
		}
	}
	w := new(fakeSink)
	flushAll(t, ft, start.Add(time.Second), w)
	if w.frames != peers {
		t.Fatalf("%d datagrams reached the guest, want %d", w.frames, peers)
	}
	for k, fd := range guest {
		i, ok := ft.byKey[k]
		if !ok || ft.flows[i].fd != fd {
			t.Errorf("the guest's flow from port %d was closed by the peers' flows", k.guestPort)
		}
	}
	inbound := ft.live - guestFlows
	if inbound < 1 || inbound > maxFlows/4 {
		t.Errorf("%d flows for forwarded peers, want 1..%d (their quota)", inbound, maxFlows/4)
	}
	if ev := ft.st.Flows.Evicted[stats.FlowUDP].Load(); ev != uint64(peers-inbound) {
		t.Errorf("%d evictions counted, want %d", ev, peers-inbound)
	}
}

// TestGuestFlowsEvictOnlyGuestFlows: the guest filling its own quota
// pushes out its own least recently used flow, not a forwarded peer's, and
// a flow used recently stays.
func TestGuestFlowsEvictOnlyGuestFlows(t *testing.T) {
	ft, fwd := forwardTable(t, Config{MaxFlows: 4, MaxInboundFlows: 2})
	c, err := net.DialUDP("udp4", nil, fwd)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("q")); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	flushAll(t, ft, now, new(fakeSink))
	if ft.lru[classInbound].n != 1 {
		t.Fatalf("%d peer flows, want 1", ft.lru[classInbound].n)
	}
	srv := loopbackUDP(t)
	keys := make([]flowKey, 6)
	for i := range keys {
		now = now.Add(time.Second)
		ft.now = now
		keys[i] = v4Key(uint16(6000+i), 53)
		if i == 3 {
			// The first flow is used again: the second becomes the oldest.
			ft.touch(ft.byKey[keys[0]])
		}
		ft.makeRoom(classGuest)
		if _, ok := ft.adopt(&keys[i], udpSocketTo(t, srv.LocalAddr().(*net.UDPAddr))); !ok {
			t.Fatal("adopt")
		}
	}
	// Six guest flows in a quota of four: keys 1 and 2 went (key 0 was
	// used again before key 3 was opened).
	for i, k := range keys {
		_, open := ft.byKey[k]
		if want := i != 1 && i != 2; open != want {
			t.Errorf("guest flow %d open = %v, want %v", i, open, want)
		}
	}
	if ft.lru[classInbound].n != 1 || ft.lru[classGuest].n != 4 {
		t.Errorf("%d peer flows and %d guest flows, want 1 and 4", ft.lru[classInbound].n, ft.lru[classGuest].n)
	}
}

// TestDiscardWithRXDisabledIsBudgeted: while the guest's RX ring is
// disabled, datagrams are read and dropped (not queued), but a turn of
// the loop drops at most flowBudget of them per socket: a peer that keeps
// sending must not hold the loop away from its other work and its stop.
func TestDiscardWithRXDisabledIsBudgeted(t *testing.T) {
	ft, fwd := forwardTable(t, Config{MaxFlows: 8})
	c, err := net.DialUDP("udp4", nil, fwd)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 5 * flowBudget // within the socket's receive buffer
	for range n {
		if _, err := c.Write([]byte("flood")); err != nil {
			t.Fatal(err)
		}
	}
	w := &fakeSink{disabled: true}
	now := time.Unix(1_000_000, 0)
	ft.Ready(hostsock.NewToken(hostsock.OwnerUDPForward, 0, 0))
	more := ft.Flush(now, w)
	dropped := ft.st.RX.Drops[stats.DropRingDisabled].Load()
	if !more || dropped != flowBudget {
		t.Fatalf("one Flush with RX disabled dropped %d datagrams of %d queued and reported more=%v; want %d and true",
			dropped, n, more, flowBudget)
	}
	// The rest goes in later turns, none delivered.
	rounds := flushAll(t, ft, now, w)
	if dropped := ft.st.RX.Drops[stats.DropRingDisabled].Load(); dropped != n || w.frames != 0 {
		t.Fatalf("%d dropped, %d delivered, want %d and 0", dropped, w.frames, n)
	}
	if rounds < n/flowBudget-1 {
		t.Fatalf("the rest was dropped in %d turns", rounds)
	}
	var buf [16]byte
	if _, _, err := unix.Recvfrom(ft.fwd.All[0].fd, buf[:], unix.MSG_DONTWAIT); err != unix.EAGAIN {
		t.Fatalf("forwarded port not drained: %v", err)
	}
}

// BenchmarkEvictionFullTable opens a flow in a full table (its least
// recently used flow goes first) at two table sizes: the cost must not
// grow with the table (it was a scan of every slot). The descriptors are
// dups of one socket; dup and close are most of what is measured.
func BenchmarkEvictionFullTable(b *testing.B) {
	srv := loopbackUDP(b)
	sock := udpSocketTo(b, srv.LocalAddr().(*net.UDPAddr))
	defer unix.Close(sock)
	for _, n := range []int{256, 8192} {
		b.Run(fmt.Sprintf("flows=%d", n), func(b *testing.B) {
			ft := newTestTable(n)
			defer ft.Close()
			open := func(i int) {
				fd, err := unix.Dup(sock)
				if err != nil {
					b.Fatal(err)
				}
				k := v4Key(uint16(i), uint16(i>>16)+1)
				ft.makeRoom(classGuest)
				if _, ok := ft.adopt(&k, fd); !ok {
					b.Fatal("adopt")
				}
			}
			for i := range n {
				open(i)
			}
			b.ResetTimer()
			for i := range b.N {
				open(n + i)
			}
		})
	}
}

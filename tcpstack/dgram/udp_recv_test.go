package dgram

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// ringSink is a guest RX ring of free buffers of bufSize bytes: without
// mrg a frame takes one buffer (its payload cut to what is left of it),
// with mrg as many as its payload needs (fewer when the ring runs out:
// MoreLater then). Committed frames are copied out in order.
type ringSink struct {
	bufSize int
	mrg     bool
	free    int
	// size is the ring's entries (0: unbounded): a reservation that
	// starved holding that many can never grow (MoreLater false).
	size    int
	whole   bool
	starved bool
	// disabled: the ring is disabled (Enabled false).
	disabled bool
	wasted   int // buffers a short commit gave back empty (reservations followed)
	out      []ringRes
	frames   [][]byte // payloads committed, in order
	hdrs     [][]byte
	vhs      []virtqueue.NetHdr // the virtio-net header of each frame
}

type ringRes struct {
	hdr  []byte
	pay  [][]byte
	bufs int
}

func (s *ringSink) Reserve(hdrLen, maxPayload int) ([]byte, [][]byte, guestring.Status) {
	if s.bufSize < hdrLen+1 {
		return nil, nil, guestring.NoFit
	}
	if s.free == 0 {
		s.starved = true
		return nil, nil, guestring.NoDesc
	}
	r := ringRes{hdr: make([]byte, hdrLen), bufs: 1}
	first := min(maxPayload, s.bufSize-hdrLen)
	r.pay = append(r.pay, make([]byte, first))
	s.whole = false
	for left := maxPayload - first; s.mrg && left > 0; r.bufs++ {
		if r.bufs == s.free {
			s.starved = true
			s.whole = s.size > 0 && r.bufs >= s.size
			break
		}
		n := min(left, s.bufSize)
		r.pay = append(r.pay, make([]byte, n))
		left -= n
	}
	s.free -= r.bufs
	s.out = append(s.out, r)
	return r.hdr, r.pay, guestring.OK
}

func (s *ringSink) Commit(n int, vh *virtqueue.NetHdr) {
	if vh == nil { // ICMP commits carry none (Sink allows it)
		vh = &virtqueue.NetHdr{}
	}
	s.vhs = append(s.vhs, *vh)
	r := s.out[0]
	s.out = s.out[1:]
	p := make([]byte, n)
	if c := header.CopyFromIovecs(p, r.pay, 0); c != n {
		panic(fmt.Sprintf("commit of %d bytes into a reservation of %d", n, c))
	}
	s.frames = append(s.frames, p)
	s.hdrs = append(s.hdrs, r.hdr)
	if s.mrg { // the buffers the frame did not need go back
		used := 1
		if rest := len(r.hdr) + n - s.bufSize; rest > 0 {
			used += (rest + s.bufSize - 1) / s.bufSize
		}
		if len(s.out) > 0 {
			s.wasted += r.bufs - used
		} else {
			s.free += r.bufs - used
		}
	}
}

func (s *ringSink) Abort() {
	for _, r := range s.out {
		s.free += r.bufs
	}
	s.out = s.out[:0]
}
func (s *ringSink) Enabled() bool   { return !s.disabled }
func (s *ringSink) MoreLater() bool { return s.mrg && s.starved && !s.whole }
func (s *ringSink) Merging() bool   { return s.mrg }

// flowTo is a table with one UDP flow whose socket is connected to a fresh
// loopback server, and the server, connected back to the flow's socket.
func flowTo(t *testing.T) (*Table, int32, *peer) {
	t.Helper()
	srv := loopbackUDP(t)
	ft := newTestTable(4)
	t.Cleanup(ft.Close)
	key := v4Key(40000, uint16(srv.LocalAddr().(*net.UDPAddr).Port))
	i, sa := adoptTestFlow(t, ft, &key, udpSocketTo(t, srv.LocalAddr().(*net.UDPAddr)))
	return ft, i, &peer{srv, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*unix.SockaddrInet4).Port}}
}

// adoptTestFlow makes fd, a socket connected to a test server, ft's flow
// for key, with room in its receive buffer for a round of the largest
// datagrams (root may exceed rmem_max), and returns the flow and the
// socket's own address (where the server sends to).
func adoptTestFlow(t *testing.T, ft *Table, key *flowKey, fd int) (int32, unix.Sockaddr) {
	t.Helper()
	i, ok := ft.adopt(key, fd)
	if !ok {
		t.Fatal("adopt")
	}
	// After adopt, which sets the flow's own size (udpRcvBuf, capped by
	// rmem_max): the tests queue more before they flush.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return i, sa
}

// peer is the host end of a test flow.
type peer struct {
	c  *net.UDPConn
	to *net.UDPAddr
}

func (p *peer) Write(b []byte) (int, error) { return p.c.WriteToUDP(b, p.to) }

// datagram is datagram number seq of size bytes: the number, then bytes
// that depend on both.
func datagram(seq, size int) []byte {
	d := make([]byte, size)
	for k := range d {
		d[k] = byte(seq*7 + k*13)
	}
	if size >= 4 {
		binary.BigEndian.PutUint32(d, uint32(seq))
	}
	return d
}

// deliver sends the datagrams of sizes from c (numbered from seq) and runs
// Flush until the flow has nothing more for w.
func deliver(t *testing.T, ft *Table, i int32, c *peer, w guestring.Sink, seq int, sizes []int) {
	t.Helper()
	for k, n := range sizes {
		if _, err := c.Write(datagram(seq+k, n)); err != nil {
			t.Fatal(err)
		}
	}
	flushFlow(t, ft, i, w)
}

func flushFlow(t *testing.T, ft *Table, i int32, w guestring.Sink) {
	t.Helper()
	ft.enqueue(i)
	for rounds := 0; ft.Flush(ft.now, w); rounds++ {
		if rounds > 10000 {
			t.Fatal("Flush keeps reporting work")
		}
	}
}

// sendSegmented sends the datagrams of lens (numbered from *seq) from c as
// one UDP_SEGMENT send of segment size seg, which the flow's UDP_GRO
// socket receives whole.
func sendSegmented(t testing.TB, c *peer, seq *int, seg int, lens ...int) []int {
	t.Helper()
	if err := trySendSegmented(c, seq, seg, lens...); err != nil {
		t.Fatal(err)
	}
	return lens
}

// trySendSegmented is sendSegmented that returns the send's error.
func trySendSegmented(c *peer, seq *int, seg int, lens ...int) error {
	raw, err := c.c.SyscallConn()
	if err != nil {
		return err
	}
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(seg))
	var buf []byte
	for _, n := range lens {
		buf = append(buf, datagram(*seq, n)...)
		*seq++
	}
	var to unix.Sockaddr = &unix.SockaddrInet4{Port: c.to.Port, Addr: [4]byte{127, 0, 0, 1}}
	if c.to.IP.To4() == nil {
		to = &unix.SockaddrInet6{Port: c.to.Port, Addr: [16]byte(c.to.IP.To16())}
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { _, serr = unix.SendmsgN(int(fd), buf, oob, to, 0) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("UDP_SEGMENT send of %d datagrams of %d bytes: %w", len(lens), seg, serr)
	}
	return nil
}

// checkFrames checks that the guest got exactly datagrams 0..len(sizes)-1
// in order, byte for byte, each with a valid UDP header and checksum.
func checkFrames(t *testing.T, ft *Table, w *ringSink, sizes []int) {
	t.Helper()
	if len(w.frames) != len(sizes) {
		t.Fatalf("the guest got %d datagrams, want %d (drops %v)", len(w.frames), len(sizes),
			ft.st.Proto.UDPDrops[stats.ToGuest][stats.DropNoFit].Load())
	}
	for k, n := range sizes {
		if want := datagram(k, n); !bytes.Equal(w.frames[k], want) {
			t.Fatalf("datagram %d (%d bytes): got %d bytes %x…, want %x…", k, n, len(w.frames[k]),
				w.frames[k][:min(8, len(w.frames[k]))], want[:min(8, n)])
		}
		u := w.hdrs[k][header.EthernetMinimumSize+header.IPv4MinimumSize:]
		if l := int(binary.BigEndian.Uint16(u[4:6])); l != udpHdrLen+n {
			t.Fatalf("datagram %d: UDP length %d, want %d", k, l, udpHdrLen+n)
		}
		key := &ft.flows[0].key
		sum := header.PseudoHeaderChecksum(header.IPProtocolUDP, key.remoteAddr(), key.guestAddr(), uint32(udpHdrLen+n))
		sum = header.Checksum(u[:udpHdrLen], sum)
		if sum = header.Checksum(w.frames[k], sum); sum != 0xffff {
			t.Fatalf("datagram %d: UDP checksum does not verify (%#x)", k, sum)
		}
	}
}

// TestUDPReceiveIsBatched: a flow's datagrams reach the guest in order and
// intact with one recvmmsg per udpRecvBatch of them (it was an ioctl and a
// recvmsg per datagram), whether the guest's buffers hold a datagram each
// or it is merged from several.
func TestUDPReceiveIsBatched(t *testing.T) {
	for _, tc := range []struct {
		name string
		sink ringSink
	}{
		{"one_buffer_each", ringSink{bufSize: 2048}},
		{"merged_buffers", ringSink{bufSize: 1536, mrg: true}},
		{"merged_small_buffers", ringSink{bufSize: 512, mrg: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft, i, c := flowTo(t)
			w := &tc.sink
			w.free = 1 << 20
			const rounds, per = 8, 64
			var sizes []int
			for r := range rounds {
				round := make([]int, per)
				for k := range round {
					round[k] = 1400
				}
				deliver(t, ft, i, c, w, r*per, round)
				sizes = append(sizes, round...)
			}
			checkFrames(t, ft, w, sizes)
			// Per round: per/udpRecvBatch full batches and the one that
			// finds the socket empty; the flow's very first datagram is
			// received alone (its size is unknown).
			calls := ft.rx.batch.Calls()
			if limit := uint64(rounds*(per/udpRecvBatch+1) + 1); calls > limit {
				t.Fatalf("%d receive calls for %d datagrams, want at most %d", calls, rounds*per, limit)
			}
			t.Logf("%d recvmmsg calls for %d datagrams", calls, rounds*per)
		})
	}
}

// TestUDPReceiveMixedSizes: datagrams larger than the reservation their
// predecessor's size suggested spill into the overflow regions and still
// reach the guest complete and in order, with the ones received behind
// them; smaller and empty ones too.
func TestUDPReceiveMixedSizes(t *testing.T) {
	pattern := []int{1400, 1400, 5000, 10, 1400, maxUDPv4Pay, 1, 0, 300, 9000, 9000, 100, 1472, 65000, 2}
	for _, tc := range []struct {
		name string
		sink ringSink
		fits func(int) bool // what the guest can take at all
	}{
		{"merged_buffers", ringSink{bufSize: 1536, mrg: true}, func(int) bool { return true }},
		{"big_buffers", ringSink{bufSize: 65562}, func(int) bool { return true }},
		{"small_buffers", ringSink{bufSize: 2048}, func(n int) bool { return n <= 2048-42 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft, i, c := flowTo(t)
			w := &tc.sink
			w.free = 1 << 20
			var want []int
			seq := 0
			for r := range 4 {
				sizes := append(append([]int(nil), pattern[r:]...), pattern[:r]...)
				var round []int
				for _, n := range sizes {
					if _, err := c.Write(datagram(seq, n)); err != nil {
						t.Fatal(err)
					}
					if tc.fits(n) {
						round = append(round, n)
						seq++
					} else {
						seq++
						round = append(round, -1)
					}
				}
				flushFlow(t, ft, i, w)
				want = append(want, round...)
			}
			// Renumber: datagrams the guest cannot take are dropped, counted.
			var got []int
			dropped := 0
			k := 0
			for s, n := range want {
				if n < 0 {
					dropped++
					continue
				}
				if k >= len(w.frames) || !bytes.Equal(w.frames[k], datagram(s, n)) {
					t.Fatalf("guest datagram %d is not datagram %d of %d bytes", k, s, n)
				}
				got = append(got, n)
				k++
			}
			if len(w.frames) != len(got) {
				t.Fatalf("the guest got %d datagrams, want %d", len(w.frames), len(got))
			}
			if d := ft.st.Proto.UDPDrops[stats.ToGuest][stats.DropNoFit].Load(); d != uint64(dropped) {
				t.Fatalf("%d datagrams dropped as too large, want %d", d, dropped)
			}
			if w.wasted != 0 {
				t.Fatalf("%d guest buffers went back empty", w.wasted)
			}
		})
	}
}

// TestUDPReceiveWaitsForBuffers: when the guest's buffers run out in the
// middle of a batch, nothing is lost: datagrams already received wait
// (pending, in the overflow regions) and go first once the guest refills,
// in order, before the socket is read again.
func TestUDPReceiveWaitsForBuffers(t *testing.T) {
	ft, i, c := flowTo(t)
	w := &ringSink{bufSize: 1536, mrg: true, free: 1}
	// Learn the size first: the hint is 1400 from here on.
	deliver(t, ft, i, c, w, 0, []int{1400})
	var sizes []int
	sizes = append(sizes, 1400)
	for k := range 40 {
		n := 1400
		if k%5 == 4 {
			n = 4000 // three buffers where the hint reserved one
		}
		sizes = append(sizes, n)
	}
	for step := 0; step < 50 && len(w.frames) < len(sizes); step++ {
		if step == 0 {
			for k, n := range sizes[1:] {
				if _, err := c.Write(datagram(k+1, n)); err != nil {
					t.Fatal(err)
				}
			}
		}
		w.free += 3 // a trickle of refills
		w.starved = false
		flushFlow(t, ft, i, w)
	}
	checkFrames(t, ft, w, sizes)
	if d := ft.st.Proto.UDPDrops[stats.ToGuest][stats.DropNoFit].Load(); d != 0 {
		t.Fatalf("%d datagrams dropped", d)
	}
}

// BenchmarkUDPRecvBatch receives 64 datagrams of 1400 bytes per op from a
// flow's socket into a sink with a buffer for each (the sends are not
// timed): 0 allocs/op.
func BenchmarkUDPRecvBatch(b *testing.B) {
	srv := loopbackUDP(b)
	ft := newTestTable(4)
	defer ft.Close()
	key := v4Key(40000, uint16(srv.LocalAddr().(*net.UDPAddr).Port))
	fd := udpSocketTo(b, srv.LocalAddr().(*net.UDPAddr))
	i, _ := ft.adopt(&key, fd)
	sa, _ := unix.Getsockname(fd)
	to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*unix.SockaddrInet4).Port}
	w := &benchSink{}
	payload := make([]byte, 1400)
	ft.now = time.Unix(1_000_000, 0)
	op := func() {
		b.StopTimer()
		for range 64 {
			if _, err := srv.WriteToUDP(payload, to); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		ft.enqueue(i)
		for ft.Flush(ft.now, w) {
		}
	}
	op() // first use: the flow learns the size, the table allocates its overflow regions
	b.ReportAllocs()
	b.SetBytes(64 * 1400)
	b.ResetTimer()
	for range b.N {
		op()
	}
	if w.frames < uint64(b.N+1)*64 {
		b.Fatalf("%d frames for %d ops", w.frames, b.N)
	}
}

// benchSink hands out a 2 KiB buffer per reservation from a ring of 64.
type benchSink struct {
	buf    [64][2048]byte
	iov    [1][]byte
	next   int
	frames uint64
}

func (s *benchSink) Reserve(hdrLen, maxPayload int) ([]byte, [][]byte, guestring.Status) {
	b := s.buf[s.next%len(s.buf)][:]
	s.next++
	s.iov[0] = b[hdrLen:min(len(b), hdrLen+maxPayload)]
	return b[:hdrLen], s.iov[:], guestring.OK
}
func (s *benchSink) Commit(int, *virtqueue.NetHdr) { s.frames++ }
func (s *benchSink) Abort()                        {}
func (s *benchSink) Enabled() bool                 { return true }
func (s *benchSink) MoreLater() bool               { return false }
func (s *benchSink) Merging() bool                 { return false }

// TestUDPReceiveSplitsCoalesced: with UDP_GRO on the flow's socket, a
// peer's run of same-size datagrams may come in as one (here: the peer
// sends them with UDP_SEGMENT over the loopback, which hands the socket the
// unsegmented buffer); the guest still gets each datagram, in order, byte
// for byte, between single ones.
func TestUDPReceiveSplitsCoalesced(t *testing.T) {
	for _, tc := range []struct {
		name string
		sink ringSink
	}{
		{"merged_buffers", ringSink{bufSize: 1536, mrg: true}},
		{"big_buffers", ringSink{bufSize: 65562}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft, i, c := flowTo(t)
			w := &tc.sink
			w.free = 1 << 20
			var sizes []int
			segmented := func(seg int, lens ...int) {
				seq := len(sizes)
				sizes = append(sizes, sendSegmented(t, c, &seq, seg, lens...)...)
			}
			single := func(n int) {
				if _, err := c.Write(datagram(len(sizes), n)); err != nil {
					t.Fatal(err)
				}
				sizes = append(sizes, n)
			}
			for r := range 3 {
				single(100 + r)
				segmented(1400, 1400, 1400, 1400, 1400, 1400, 1400, 1400, 700)
				segmented(1000, 1000, 1000)
				single(5000)
				segmented(1472, slices.Repeat([]int{1472}, 40)...)
				flushFlow(t, ft, i, w)
			}
			checkFrames(t, ft, w, sizes)
			if ft.rx.coalesced == 0 {
				t.Fatal("the kernel coalesced nothing: UDP_GRO is not on the flow's socket")
			}
			t.Logf("%d datagrams, %d coalesced receives, %d recvmmsg calls", len(sizes), ft.rx.coalesced, ft.rx.batch.Calls())
		})
	}
}

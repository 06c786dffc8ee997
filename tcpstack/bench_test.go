package tcpstack

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// benchLoop builds a pair's loop without running it, so a benchmark can call
// its steps directly on the benchmark goroutine.
func benchLoop(b testing.TB, p *testPair) *loop {
	b.Helper()
	p.s.mu.Lock()
	ps, err := p.s.pairStateLocked(p.qp.Index)
	p.s.mu.Unlock()
	if err != nil {
		b.Fatal(err)
	}
	p.qp.RX, p.qp.TX = p.rx.Q, p.tx.Q
	l, err := newLoop(p.s, p.qp, ps, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		l.closeFDs()
		ps.loop = nil // the Stack's Close closes the tables
	})
	return l
}

func benchTX(b *testing.B, frame []byte) {
	p := newTestPair(b, featModern, 256)
	l := benchLoop(b, p)
	heads := make([]uint16, txBatchMax)
	for i := range heads {
		heads[i] = p.newTX(frame) // repost places and publishes them
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(frame) * txBatchMax))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.tx.repost(heads)
		l.txBatch()
		l.pending.head, l.pending.count = 0, 0
	}
	b.StopTimer()
	if got := l.st.TX.Frames.Load(); got != uint64(b.N*txBatchMax) {
		b.Fatalf("frames %d, want %d", got, b.N*txBatchMax)
	}
}

// BenchmarkTXBatchDrop is the TX path's fixed cost: pop 64 chains, copy
// and parse headers, push and flush once.
func BenchmarkTXBatchDrop(b *testing.B) { benchTX(b, otherFrame(0x88b5, 1514)) }

// BenchmarkTXBatchARP adds a link service building a reply per frame.
func BenchmarkTXBatchARP(b *testing.B) { benchTX(b, arpRequest(testGuestIP, testGwIP)) }

// BenchmarkRXWriteFrame writes 64 frames into guest RX buffers and
// publishes them with one Flush.
func BenchmarkRXWriteFrame(b *testing.B) {
	for _, tc := range []struct {
		name string
		feat uint64
		buf  uint32
		size int
	}{{"small", featModern, 2048, 64}, {"1500", featModern, 2048, 1514}, {"mrg_9000", featMrg, 1536, 9014}} {
		b.Run(tc.name, func(b *testing.B) { benchRXWriteFrame(b, tc.feat, tc.buf, tc.size, nil) })
	}
}

// benchRXWriteFrame writes 64 frames of size bytes into RX buffers of buf
// bytes each and publishes them, per iteration, with capture (if any) set.
func benchRXWriteFrame(b *testing.B, feat uint64, buf uint32, size int, capture guestring.FrameCapture) {
	p := newTestPair(b, feat, 1024)
	p.s.cfg.Capture = capture
	l := benchLoop(b, p)
	per := (size + 12 + int(buf) - 1) / int(buf)
	heads := make([]uint16, 64*per)
	for i := range heads {
		heads[i] = p.rx.NewBuffers(nil, buf)
	}
	frame := otherFrame(0x88b5, size)
	b.ReportAllocs()
	b.SetBytes(int64(size * 64))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.rx.repost(heads)
		for j := 0; j < 64; j++ {
			if s := l.rx.WriteFrame(frame, 0); s != guestring.OK {
				b.Fatalf("writeFrame: %v", s)
			}
		}
		l.rx.Publish()
	}
	b.StopTimer()
}

// benchUDPFlow sets up a loop (not running) with one UDP flow from the guest
// to a "remote" socket on loopback, and returns the remote's fd connected to
// the flow's host socket and the remote's port.
func benchUDPFlow(b testing.TB, p *testPair) (l *loop, remote int, port uint16) {
	b.Helper()
	remote, port = benchRemote(b)
	l = benchLoop(b, p)
	l.now = time.Now()
	l.tx.hdr = virtqueue.NetHdr{}
	frame := udpFrame(testGuest4, testGw4, 40000, port, []byte("open"))
	p.addTX(frame)
	p.tx.Post()
	l.txBatch()
	connectRemote(b, remote)
	return l, remote, port
}

// benchRemote is a UDP socket on loopback, the remote end of a benchmark's
// flow, and its port.
func benchRemote(b testing.TB) (remote int, port uint16) {
	b.Helper()
	remote, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(remote) })
	if err := unix.Bind(remote, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		b.Fatal(err)
	}
	sa, _ := unix.Getsockname(remote)
	return remote, uint16(sa.(*unix.SockaddrInet4).Port)
}

// readPeer is a blocking read by a benchmark's host peer, again when a
// signal (a GC's, a preemption's) ended it.
func readPeer(fd int, b []byte) (int, error) {
	for {
		n, err := unix.Read(fd, b)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// connectRemote connects remote to the flow's host socket, which the
// first datagram it received came from.
func connectRemote(b testing.TB, remote int) {
	b.Helper()
	var buf [64]byte
	_, from, err := unix.Recvfrom(remote, buf[:], 0)
	for err == unix.EINTR { // a signal (a GC's, a preemption's) ended the read
		_, from, err = unix.Recvfrom(remote, buf[:], 0)
	}
	if err != nil {
		b.Fatal(err)
	}
	if err := unix.Connect(remote, from); err != nil {
		b.Fatal(err)
	}
}

// pollSockets hands the socket events epoll has for l to their owners, as
// the running loop does.
func (l *loop) pollSockets() {
	n, _ := l.ep.Wait(l.events[:], 0)
	for i := 0; i < n; i++ {
		if tok := hostsock.EventToken(&l.events[i]); tok.Owner() != hostsock.OwnerLoop {
			l.onSocket(tok, l.events[i].Events)
		}
	}
}

// BenchmarkUDPFromGuest sends 64 guest datagrams per op from TX chains
// through the flow's socket (payload straight from guest memory).
func BenchmarkUDPFromGuest(b *testing.B) {
	p := newFlowPair(b, featModern, nil)
	l, _, port := benchUDPFlow(b, p)
	frame := udpFrame(testGuest4, testGw4, 40000, port, make([]byte, 1400)) // the flow's
	heads := make([]uint16, txBatchMax)
	for i := range heads {
		heads[i] = p.newTX(frame)
	}
	b.ReportAllocs()
	b.SetBytes(1400 * txBatchMax)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.tx.repost(heads)
		l.txBatch()
	}
	b.StopTimer()
	if d := l.st.TX.Drops[stats.DropSendError].Load(); d != 0 {
		b.Logf("send errors: %d", d)
	}
}

// BenchmarkUDPToGuest receives 64 datagrams per op from the flow's socket
// straight into reserved guest RX buffers, headers and checksum built in
// place, published with one Flush.
func BenchmarkUDPToGuest(b *testing.B) {
	for _, tc := range []struct {
		name string
		feat uint64
	}{{"csum_sw", featModern}, {"csum_offload", featModern | testFeatCsm}} {
		b.Run(tc.name, func(b *testing.B) {
			p := newFlowPair(b, tc.feat, nil)
			l, remote, _ := benchUDPFlow(b, p)
			heads := make([]uint16, 64)
			for i := range heads {
				heads[i] = p.rx.NewBuffers(nil, 2048)
			}
			payload := make([]byte, 1400)
			op := func() {
				for j := 0; j < 64; j++ {
					if _, err := unix.Write(remote, payload); err != nil {
						b.Fatal(err)
					}
				}
				p.rx.repost(heads)
				l.pollSockets()
				for l.flows.Flush(l.now, &l.rx) {
				}
				l.rx.Publish()
			}
			op() // first use: the flow learns the datagram size, the table allocates its overflow regions
			b.ReportAllocs()
			b.SetBytes(1400 * 64)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				op()
			}
			b.StopTimer()
			if got := l.st.RX.Frames.Load(); got < uint64((b.N+1)*64) {
				b.Fatalf("frames %d, want %d", got, (b.N+1)*64)
			}
		})
	}
}

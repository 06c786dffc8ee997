package tcpstack

import (
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/stream"
	"vunet/virtqueue"
)

// streamBenchLoop builds a stream loop (not running) over one end of a
// socket pair and returns it with the other end (QEMU's), and a UDP flow
// from the guest to a loopback "remote" as benchUDPFlow's.
func streamBenchLoop(b *testing.B) (l *loop, peer, remote int, port uint16) {
	b.Helper()
	p := newFlowPair(b, 0, nil)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	for _, fd := range fds {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
	}
	p.s.mu.Lock()
	ps, err := p.s.pairStateLocked(0)
	p.s.mu.Unlock()
	if err != nil {
		b.Fatal(err)
	}
	sl := new(streamLink)
	sl.r.Init(stream.ReadBufSize)
	sl.reset(fds[0], ps, p.s)
	l, err = newLoop(p.s, virtqueue.QueuePair{RXEnabled: true, TXEnabled: true}, ps, sl)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		l.closeFDs()
		unix.Close(l.wakefd)
		ps.loop = nil // the Stack's Close closes the tables
	})
	l.now = time.Now()

	remote, port = benchRemote(b)
	writeFramed(b, fds[1], udpFrame(testGuest4, testGw4, 40000, port, []byte("open")))
	l.streamTX()
	connectRemote(b, remote)
	return l, fds[1], remote, port
}

func writeFramed(b *testing.B, fd int, frames ...[]byte) {
	b.Helper()
	var w []byte
	for _, f := range frames {
		w = binary.BigEndian.AppendUint32(w, uint32(len(f)))
		w = append(w, f...)
	}
	if _, err := unix.Write(fd, w); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStreamUDPFromGuest: 64 guest datagrams per op written to the
// stream (QEMU's write is in the timing), read with one recv, dispatched
// by handleTXFrame and sent on the flow's socket straight from the read
// buffer.
func BenchmarkStreamUDPFromGuest(b *testing.B) {
	l, peer, _, port := streamBenchLoop(b)
	frame := udpFrame(testGuest4, testGw4, 40000, port, make([]byte, 1400))
	var wire []byte
	for i := 0; i < 64; i++ {
		wire = binary.BigEndian.AppendUint32(wire, uint32(len(frame)))
		wire = append(wire, frame...)
	}
	b.ReportAllocs()
	b.SetBytes(1400 * 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := unix.Write(peer, wire); err != nil {
			b.Fatal(err)
		}
		l.streamTX()
	}
	b.StopTimer()
	if got := l.st.TX.Frames.Load(); got != uint64(b.N*64+1) {
		b.Fatalf("frames %d, want %d", got, b.N*64+1)
	}
}

// BenchmarkStreamUDPToGuest: 64 datagrams per op received from the flow's
// socket straight into the stream's send buffer, headers and checksum
// built in place, written with one sendmsg (QEMU's read is in the
// timing).
func BenchmarkStreamUDPToGuest(b *testing.B) {
	l, peer, remote, _ := streamBenchLoop(b)
	payload := make([]byte, 1400)
	sink := make([]byte, 1<<20)
	want := 64 * (stream.LenSize + 14 + 20 + 8 + 1400)
	op := func() {
		for j := 0; j < 64; j++ {
			if _, err := unix.Write(remote, payload); err != nil {
				b.Fatal(err)
			}
		}
		l.out.BeginIteration()
		l.pollSockets()
		for l.flows.Flush(l.now, l.out) {
		}
		l.out.Publish()
		for got := 0; got < want; {
			n, err := readPeer(peer, sink)
			if err != nil {
				b.Fatal(err)
			}
			got += n
		}
	}
	op() // first use: the table allocates its overflow regions
	frames := l.st.RX.Frames.Load()
	b.ReportAllocs()
	b.SetBytes(1400 * 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		op()
	}
	b.StopTimer()
	if got := l.st.RX.Frames.Load() - frames; got != uint64(b.N*64) {
		b.Fatalf("frames %d, want %d", got, b.N*64)
	}
}

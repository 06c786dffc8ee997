package tcpstack

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// batchDatagram is datagram number seq of size bytes of a sequence test:
// the number, then bytes that depend on both.
func batchDatagram(seq, size int) []byte {
	d := make([]byte, size)
	for k := range d {
		d[k] = byte(seq*7 + k*13)
	}
	if size >= 4 {
		binary.BigEndian.PutUint32(d, uint32(seq))
	}
	return d
}

// batchSize is the size of datagram k of a sequence test: mostly around
// an MTU's worth, some larger than one guest buffer, some tiny.
func batchSize(k int) int {
	switch k % 10 {
	case 9:
		return 4000
	case 4:
		return 1
	}
	return 1000 + k*37%450
}

// TestUDPManyDatagramsToGuest: a host peer's burst of datagrams of mixed
// sizes reaches the guest through the real RX ring (merged 1536-byte
// buffers) complete, in order and with valid checksums, received in
// batches whose reservations follow the last size seen.
func TestUDPManyDatagramsToGuest(t *testing.T) {
	p := newFlowPair(t, featMrg, nil)
	srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	port := uint16(srv.LocalAddr().(*net.UDPAddr).Port)
	p.postRX(250, 1536)
	p.start()
	// The guest's first datagram opens the flow and tells the peer where
	// the flow's socket is.
	p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte("hello")))
	p.tx.Send()
	buf := make([]byte, 70000)
	srv.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, flowAddr, err := srv.ReadFromUDP(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("peer got %q %v", buf[:n], err)
	}
	const total, chunk = 150, 30 // chunks stay within the socket's receive buffer
	for c := 0; c < total; c += chunk {
		for k := c; k < c+chunk; k++ {
			if _, err := srv.WriteToUDP(batchDatagram(k, batchSize(k)), flowAddr); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "chunk delivered", 3*time.Second, func() bool { return p.rxFrames(1) == uint64(c+chunk) })
	}
	p.s.StopPair(0)
	hdrs, frames := p.rxReadIP(t)
	if len(frames) != total {
		t.Fatalf("%d frames, want %d", len(frames), total)
	}
	for k := range total {
		checkUDPFrame(t, hdrs[k], frames[k], testGw4, testGuest4, port, 40000, batchDatagram(k, batchSize(k)))
		if t.Failed() {
			t.Fatalf("frame %d (of %d bytes) is not datagram %d", k, batchSize(k), k)
		}
	}
}

// TestUDPManyDatagramsFromGuest: a guest burst of datagrams of mixed sizes
// in one TX batch reaches the host peer complete and in order.
func TestUDPManyDatagramsFromGuest(t *testing.T) {
	p := newFlowPair(t, featMrg, nil)
	srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	port := uint16(srv.LocalAddr().(*net.UDPAddr).Port)
	p.start()
	const total, chunk = 150, 50
	buf := make([]byte, 70000)
	for c := 0; c < total; c += chunk {
		for k := c; k < c+chunk; k++ {
			p.addTX(udpFrame(testGuest4, testGw4, 40000, port, batchDatagram(k, batchSize(k))))
		}
		p.tx.Send()
		for k := c; k < c+chunk; k++ {
			srv.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, _, err := srv.ReadFromUDP(buf)
			if err != nil {
				t.Fatalf("datagram %d: %v", k, err)
			}
			if want := batchDatagram(k, batchSize(k)); !bytes.Equal(buf[:n], want) {
				t.Fatalf("peer's datagram %d: %d bytes %x…, want %d bytes %x…", k, n, buf[:min(n, 8)], len(want), want[:min(len(want), 8)])
			}
		}
	}
}

// TestUDPSendsAreBatched: a TX batch of one flow's datagrams goes out with
// one sendmmsg per hostsock.MaxBatch of them (it was a sendmsg each), and
// the peer gets them all, in order, byte for byte.
func TestUDPSendsAreBatched(t *testing.T) {
	p := newFlowPair(t, featModern, nil)
	l, remote, port := benchUDPFlow(t, p)
	if unix.SetsockoptInt(remote, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) != nil {
		_ = unix.SetsockoptInt(remote, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	_, before, _ := l.flows.SyscallCounts()
	for k := range txBatchMax {
		p.addTX(udpFrame(testGuest4, testGw4, 40000, port, batchDatagram(k, batchSize(k))))
	}
	p.tx.Post()
	l.txBatch()
	_, after, _ := l.flows.SyscallCounts()
	if calls, want := after-before, uint64(txBatchMax/hostsock.MaxBatch); calls != want {
		t.Errorf("%d sendmmsg calls for %d datagrams, want %d", calls, txBatchMax, want)
	}
	buf := make([]byte, 70000)
	for k := range txBatchMax {
		n, err := unix.Read(remote, buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", k, err)
		}
		if want := batchDatagram(k, batchSize(k)); !bytes.Equal(buf[:n], want) {
			t.Fatalf("peer's datagram %d: %d bytes, want %d", k, n, len(want))
		}
	}
	if got := l.st.Proto.UDPDatagrams[stats.FromGuest].Load(); got != txBatchMax+1 {
		t.Errorf("%d datagrams counted sent, want %d", got, txBatchMax+1)
	}
}

// sameSizeBatch queues a TX batch of txBatchMax datagrams of 1400 bytes
// but the last (500) on l's flow to port and runs it.
func sameSizeBatch(p *testPair, l *loop, port uint16, seq int) []int {
	sizes := make([]int, txBatchMax)
	for k := range sizes {
		sizes[k] = 1400
	}
	sizes[len(sizes)-1] = 500
	for k, n := range sizes {
		p.addTX(udpFrame(testGuest4, testGw4, 40000, port, batchDatagram(seq+k, n)))
	}
	p.tx.Post()
	l.txBatch()
	return sizes
}

// readDatagrams reads len(sizes) datagrams from remote and checks them
// against datagrams seq... of those sizes.
func readDatagrams(t *testing.T, remote int, seq int, sizes []int) {
	t.Helper()
	buf := make([]byte, 70000)
	for k, n := range sizes {
		m, err := unix.Read(remote, buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", seq+k, err)
		}
		if !bytes.Equal(buf[:m], batchDatagram(seq+k, n)) {
			t.Fatalf("peer's datagram %d: %d bytes, want %d", seq+k, m, n)
		}
	}
}

// TestUDPSameSizeDatagramsGoSegmented: a TX batch of one flow's datagrams
// of one size leaves in UDP_SEGMENT messages (UDP GSO: as many datagrams
// each as one IPv4 packet holds, 46 of 1400 bytes) of one sendmmsg per
// hostsock.MaxBatch queued, and the kernel cuts them back into exactly the
// guest's datagrams, the shorter last one included.
func TestUDPSameSizeDatagramsGoSegmented(t *testing.T) {
	p := newFlowPair(t, featModern, nil)
	l, remote, port := benchUDPFlow(t, p)
	if unix.SetsockoptInt(remote, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) != nil {
		_ = unix.SetsockoptInt(remote, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	_, before, _ := l.flows.SyscallCounts()
	sizes := sameSizeBatch(p, l, port, 0)
	_, after, segmented := l.flows.SyscallCounts()
	// 64 datagrams: one sendmmsg, of 46 × 1400 bytes (an IPv4 packet's
	// most) and 17 × 1400 + 500.
	const wantCalls, wantSegmented = 1, 2
	if after-before != wantCalls || segmented != wantSegmented {
		t.Errorf("%d send calls, %d UDP_SEGMENT messages for %d datagrams; want %d and %d", after-before, segmented, txBatchMax, wantCalls, wantSegmented)
	}
	readDatagrams(t, remote, 0, sizes)
	if got := l.st.Proto.UDPDatagrams[stats.FromGuest].Load(); got != txBatchMax+1 {
		t.Errorf("%d datagrams counted sent, want %d", got, txBatchMax+1)
	}
}

//go:build vunetfault

package tcpstack

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// TestFaultUDPSendErrors: sendmsg refusing guest datagrams (ENOBUFS,
// EAGAIN; injected) drops those datagrams, counted as send errors, and
// nothing else: the flow and its socket stay, and the next datagram goes
// out and is answered. (This passed before the hardening work too.)
func TestFaultUDPSendErrors(t *testing.T) {
	p, port := udpEchoPair(t)
	st := p.stats()
	for i, e := range []unix.Errno{unix.ENOBUFS, unix.EAGAIN} {
		cancel := hostsock.InjectSendError(e, 1)
		p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte("lost")))
		p.tx.Send()
		waitFor(t, "send error counted", 3*time.Second, func() bool {
			return st.Proto.UDPDrops[stats.FromGuest][stats.DropSendError].Load() == uint64(i+1)
		})
		cancel()
	}
	expectOnlyEcho(t, p, port, "after")
	if o := dgramOpened(st); o != 1 {
		t.Errorf("%d flows opened, want 1 (the failed sends must not close it)", o)
	}
}

// TestFaultUDPSendErrorsInBatch: in a TX batch of one flow's datagrams
// sent with sendmmsg, a send error (injected) costs exactly the datagram
// it hit: the ones after it still reach the peer, in order; an
// ECONNREFUSED (an earlier datagram's ICMP error) is retried once.
func TestFaultUDPSendErrorsInBatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   unix.Errno
		times int
		lost  int // the first lost datagrams
	}{
		{"enobufs", unix.ENOBUFS, 3, 3},
		{"eagain", unix.EAGAIN, 1, 1},
		{"refused_once", unix.ECONNREFUSED, 1, 0},
		{"refused_twice", unix.ECONNREFUSED, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFlowPair(t, featModern, nil)
			l, remote, port := benchUDPFlow(t, p)
			const n = 10
			for k := range n {
				p.addTX(udpFrame(testGuest4, testGw4, 40000, port, batchDatagram(k, 100+k)))
			}
			p.tx.Post()
			cancel := hostsock.InjectSendError(tc.err, tc.times)
			l.txBatch()
			cancel()
			buf := make([]byte, 2048)
			for k := tc.lost; k < n; k++ {
				m, err := unix.Read(remote, buf)
				if err != nil || !bytes.Equal(buf[:m], batchDatagram(k, 100+k)) {
					t.Fatalf("peer's datagram: %d bytes %v, want datagram %d", m, err, k)
				}
			}
			if d := l.st.Proto.UDPDrops[stats.FromGuest][stats.DropSendError].Load(); d != uint64(tc.lost) {
				t.Errorf("%d send errors counted, want %d", d, tc.lost)
			}
			if s := l.st.Proto.UDPDatagrams[stats.FromGuest].Load(); s != uint64(1+n-tc.lost) {
				t.Errorf("%d datagrams counted sent, want %d", s, 1+n-tc.lost)
			}
		})
	}
}

// TestFaultUDPSegmentRefused: a UDP_SEGMENT message the kernel refuses
// (EIO, a device without checksum offload; injected) goes again datagram
// by datagram, nothing lost, and the flow stops trying UDP_SEGMENT.
func TestFaultUDPSegmentRefused(t *testing.T) {
	p := newFlowPair(t, featModern, nil)
	l, remote, port := benchUDPFlow(t, p)
	if unix.SetsockoptInt(remote, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) != nil {
		_ = unix.SetsockoptInt(remote, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	cancel := hostsock.InjectSendError(unix.EIO, 1)
	sizes := sameSizeBatch(p, l, port, 0)
	cancel()
	readDatagrams(t, remote, 0, sizes)
	sizes = sameSizeBatch(p, l, port, txBatchMax)
	readDatagrams(t, remote, txBatchMax, sizes)
	if _, _, seg := l.flows.SyscallCounts(); seg != 0 {
		t.Errorf("%d UDP_SEGMENT messages after the kernel refused one", seg)
	}
	if d := l.st.Proto.UDPDrops[stats.FromGuest][stats.DropSendError].Load(); d != 0 {
		t.Errorf("%d send errors counted", d)
	}
}

//go:build vunetfault

package tcpstack

import (
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
	p := newFlowPair(t, featModern, nil)
	port := udpEcho(t, "udp4", "127.0.0.1:0")
	for range 16 {
		p.rx.AddBuffers(nil, 2048)
	}
	p.rx.Post()
	p.start()
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
	p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte("after")))
	p.tx.Send()
	waitFor(t, "echo", 3*time.Second, func() bool { return p.rxFrames(1) == 1 })
	p.s.StopPair(0)
	hdrs, frames := p.rxReadIP(t)
	if len(frames) != 1 {
		t.Fatalf("%d frames to the guest, want the one echo", len(frames))
	}
	checkUDPFrame(t, hdrs[0], frames[0], testGw4, testGuest4, port, 40000, []byte("after"))
	if o := st.FlowsOpened.Load(); o != 1 {
		t.Errorf("%d flows opened, want 1 (the failed sends must not close it)", o)
	}
}

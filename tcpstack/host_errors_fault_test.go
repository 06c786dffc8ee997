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

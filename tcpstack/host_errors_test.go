package tcpstack

import (
	"testing"
	"time"

	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// udpEchoPair starts a pair with RX buffers posted and a UDP echo peer on
// the host's loopback, reached through the gateway; it returns the peer's
// port.
func udpEchoPair(t *testing.T) (*testPair, uint16) {
	t.Helper()
	p := newFlowPair(t, featModern, nil)
	port := udpEcho(t, "udp4", "127.0.0.1:0")
	for range 16 {
		p.rx.AddBuffers(nil, 2048)
	}
	p.rx.Post()
	p.start()
	return p, port
}

// expectOnlyEcho sends payload to the echo peer and requires its echo to
// be the one frame the guest gets.
func expectOnlyEcho(t *testing.T, p *testPair, port uint16, payload string) {
	t.Helper()
	p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte(payload)))
	p.tx.Send()
	waitFor(t, "echo", 3*time.Second, func() bool { return p.rxFrames(1) == 1 })
	p.s.StopPair(0)
	hdrs, frames := p.rxReadIP(t)
	if len(frames) != 1 {
		t.Fatalf("%d frames to the guest, want the one echo", len(frames))
	}
	checkUDPFrame(t, hdrs[0], frames[0], testGw4, testGuest4, port, 40000, []byte(payload))
}

// TestUDPFlowAtFDLimit: with no descriptor left for a flow's socket
// (EMFILE), the guest's datagram is dropped and counted (no_flow), nothing
// is left half open, and once descriptors are free again the next
// datagram opens its flow and is answered. (This passed before the
// hardening work too.)
func TestUDPFlowAtFDLimit(t *testing.T) {
	p, port := udpEchoPair(t)
	st := p.stats()
	restore := testenv.LimitFDs(t)
	p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte("lost")))
	p.tx.Send()
	waitFor(t, "drop counted", 3*time.Second, func() bool {
		return st.Proto.UDPDrops[stats.FromGuest][stats.DropNoFlow].Load() == 1
	})
	restore()
	if o, l := dgramOpened(st), st.Flows.Live[stats.FlowUDP].Load(); o != 0 || l != 0 {
		t.Fatalf("%d flows opened, %d live at the descriptor limit", o, l)
	}
	expectOnlyEcho(t, p, port, "after")
}

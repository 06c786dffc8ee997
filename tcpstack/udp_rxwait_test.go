package tcpstack

import (
	"net"
	"testing"
	"time"
)

// TestUDPLoopRXWaitCounted: a host peer's datagrams to a guest whose ring
// holds a few buffers. The datagram output that runs the ring dry starts a
// wait, counted once in RXWaitedForDescriptors: not again on the passes
// that find the ring still dry (a guest frame makes one), again when a
// refill is used up and the ring runs dry anew, and not when the guest
// posts enough for the rest. Without the count, a UDP stream that lost
// datagrams in its host socket while the guest posted no buffers looked,
// in the metrics, as if the back-end had lost them.
func TestUDPLoopRXWaitCounted(t *testing.T) {
	p := newFlowPair(t, featMrg, nil)
	srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	port := uint16(srv.LocalAddr().(*net.UDPAddr).Port)
	p.postRX(8, 1536)
	p.start()
	buf := make([]byte, 2048)
	fromGuest := func(msg string) *net.UDPAddr {
		t.Helper()
		p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte(msg)))
		p.tx.Send()
		srv.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, from, err := srv.ReadFromUDP(buf)
		if err != nil || string(buf[:n]) != msg {
			t.Fatalf("peer got %q, %v; want %q", buf[:n], err, msg)
		}
		return from
	}
	refill := func(n int) { // posted and kicked, as a guest's refill
		for range n {
			p.rx.AddBuffers(nil, 1536)
		}
		p.rx.Send()
	}
	flow := fromGuest("hello")
	st := p.stats()
	// What the start's announcements left of the eight buffers.
	waitFor(t, "announcements", 3*time.Second, func() bool { return p.rxFrames(0) >= uint64(p.announced) })
	room := 8 - p.rxFrames(0)
	frames0, waits0 := p.rxFrames(0), st.RXWaitedForDescriptors.Load()

	const total = 30
	for k := range total {
		if _, err := srv.WriteToUDP(batchDatagram(k, 1000), flow); err != nil {
			t.Fatal(err)
		}
	}
	delivered := func() uint64 { return p.rxFrames(0) - frames0 }
	waits := func() uint64 { return st.RXWaitedForDescriptors.Load() - waits0 }
	waitFor(t, "the ring run dry", 3*time.Second, func() bool { return delivered() == room && waits() == 1 })
	// A pass that finds the ring still dry is the same wait. The peer has
	// the first frame once its pass sent it, maybe before that pass's RX
	// output; the second is taken in a later pass, after that output.
	fromGuest("still dry")
	fromGuest("still dry, next pass")
	if d, w := delivered(), waits(); d != room || w != 1 {
		t.Fatalf("after a pass with the ring still dry: %d delivered, %d waits; want %d and 1", d, w, room)
	}
	// A refill used up: a second wait.
	refill(4)
	waitFor(t, "the refill used up", 3*time.Second, func() bool { return delivered() == room+4 && waits() == 2 })

	// Enough for the rest: no wait.
	refill(total)
	waitFor(t, "the rest delivered", 3*time.Second, func() bool { return delivered() == total })
	if w := waits(); w != 2 {
		t.Fatalf("%d waits once the guest posted enough, want 2", w)
	}
}

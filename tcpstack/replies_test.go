package tcpstack

import (
	"encoding/binary"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
)

// TestAnnouncementNotADrop: the link announcement (gratuitous ARP for the
// gateway) made at every pair start is not a dropped frame when the guest
// cannot take it yet. A pair started with its RX ring disabled does not
// queue it (the start that follows the ring's enabling announces), and a
// pair restarted before the guest posted RX buffers discards the pending
// one without counting it (the next start queues a fresh one). The
// announcement still reaches the guest, once, when buffers come.
func TestAnnouncementNotADrop(t *testing.T) {
	p := newFlowPair(t, featModern, nil)

	// As QEMU does with PROTOCOL_FEATURES: the pair runs before
	// SET_VRING_ENABLE enables its RX ring.
	p.qp.RXEnabled = false
	p.start()
	st := p.stats()
	drops := func() uint64 { return st.RX.Drops[stats.DropRingDisabled].Load() }
	time.Sleep(20 * time.Millisecond)
	p.s.StopPair(0)
	if d := drops(); d != 0 {
		t.Fatalf("%d ring_disabled drops at a start with RX disabled", d)
	}

	// Enabled, but the guest has not posted RX buffers yet; the front-end
	// restarts the pair (a new call fd, say) before it does.
	p.qp.RXEnabled = true
	p.restart()
	time.Sleep(20 * time.Millisecond)
	p.restart()
	time.Sleep(20 * time.Millisecond)
	if d := drops(); d != 0 {
		t.Fatalf("%d ring_disabled drops across a restart with the announcement pending", d)
	}

	for i := 0; i < 4; i++ {
		p.rx.AddBuffers(nil, 2048)
	}
	p.rx.Send()
	waitFor(t, "announcement", 2*time.Second, func() bool { return p.rx.UsedIdx() >= 1 })
	time.Sleep(20 * time.Millisecond)
	_, frames := p.rxRead(t)
	arps := 0
	for _, f := range frames {
		if binary.BigEndian.Uint16(f[12:14]) == uint16(header.EtherTypeARP) {
			arps++
		}
	}
	if arps != 1 || len(frames) != 1 {
		t.Fatalf("%d frames, %d gratuitous ARPs after the refill, want exactly one", len(frames), arps)
	}
	p.s.StopPair(0)
	if d := drops(); d != 0 {
		t.Fatalf("%d ring_disabled drops", d)
	}
	// Counted as a reply once: the one delivered, not the two discarded.
	if n := st.ServiceReplies[stats.SvcARP].Load(); n != 1 {
		t.Fatalf("%d ARP service replies counted for one delivered announcement", n)
	}
	if n := st.RX.Drops[stats.DropPendingOverflow].Load(); n != 0 {
		t.Fatalf("%d pending overflows", n)
	}
}

package tcpstack

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
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

// TestInitialRouterAdvertisements: the pair start's Router Advertisement
// reaches the guest when its driver posts RX buffers, which a Linux guest
// does before it calls the link ready, and Linux drops the address it
// configures from an RA received then (replies.go). More unsolicited RAs
// must follow without any guest frame (RFC 4861's initial
// advertisements), counted from that delivery: a guest that posts its
// buffers long after the pair started must not get them in one burst.
// Before, the next unsolicited RA came raInterval (10 minutes) later.
func TestInitialRouterAdvertisements(t *testing.T) {
	p := newTestPair(t, featMrg, 64)
	p.s = New(Config{Logger: testenv.Logger(), Addr: linkConfig()})
	t.Cleanup(p.s.Close)
	p.start()
	st := p.stats()
	ras := func() uint64 { return st.Proto.RouterAdverts.Load() }
	// The guest boots: no RX buffers for longer than the first gap.
	time.Sleep(initialRAGap + 500*time.Millisecond)
	if n := ras(); n != 0 {
		t.Fatalf("%d RAs delivered without RX buffers", n)
	}
	for i := 0; i < 16; i++ {
		p.rx.AddBuffers(nil, 1536)
	}
	p.rx.Send()
	waitFor(t, "the pair start's RA", 2*time.Second, func() bool { return ras() >= 1 })
	first := time.Now()
	if n := ras(); n != 1 {
		t.Fatalf("%d RAs at once when the guest posted its buffers, want 1", n)
	}
	waitFor(t, "a second unsolicited RA", initialRAGap+3*time.Second, func() bool { return ras() >= 2 })
	gap := time.Since(first)
	p.s.StopPair(0)
	if gap < initialRAGap/2 {
		t.Fatalf("second RA %v after the first, want about %v", gap, initialRAGap)
	}
	_, frames := p.rxRead(t)
	var kinds []string
	for _, f := range frames {
		kind := "other"
		switch binary.BigEndian.Uint16(f[12:14]) {
		case uint16(header.EtherTypeARP):
			kind = "arp"
		case uint16(header.EtherTypeIPv6):
			if ip := f[header.EthernetMinimumSize:]; ip[6] == uint8(header.IPProtocolICMPv6) && ip[40] == 134 {
				kind = "ra"
			}
		}
		kinds = append(kinds, kind)
	}
	if want := "[arp ra ra]"; fmt.Sprint(kinds) != want {
		t.Fatalf("frames to the guest %v, want %s", kinds, want)
	}
	t.Logf("second RA %v after the first", gap.Round(time.Millisecond))
}

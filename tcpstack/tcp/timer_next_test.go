package tcp

import (
	"testing"
	"time"

	"vunet/tcpstack/header"
)

// TestTCPNextTimerFollowsAck: the tail-loss probe armed for a flight is
// cancelled by the guest's ACK for all of it, and the table's next
// deadline moves with it to the connection's next real one. Before, it
// stayed at the probe's: the loop woke for nothing after every flight of
// a download (timer_next.go).
func TestTCPNextTimerFollowsAck(t *testing.T) {
	h, f, _, start, data := sackConn(t, Config{MTU: 1500, AckTimeout: time.Hour}, 4)
	h.now = h.now.Add(time.Millisecond)
	h.ack = start + 2800
	h.sendAck(nil) // an RTT sample: the probe is armed
	h.flush()
	probe := f.lastAckProg.Add(h.tab.pto(f))
	if !h.tab.tlpArmed(f) || !h.tab.NextTimer().Equal(probe) {
		t.Fatalf("probe armed %v, next timer in %v, want the probe's %v", h.tab.tlpArmed(f),
			h.tab.NextTimer().Sub(h.now), probe.Sub(h.now))
	}
	h.ack = start + uint32(len(data))
	h.sendAck(nil)
	h.flush()
	next := h.tab.NextTimer()
	if want := h.tab.deadline(f); !next.Equal(want) || !next.After(probe) {
		t.Fatalf("next timer in %v after the ACK of the whole flight, want the connection's deadline in %v (the probe was due in %v)",
			next.Sub(h.now), want.Sub(h.now), probe.Sub(h.now))
	}
}

// TestTCPNextTimerFlowGone: when the connection whose deadline was the
// table's next one goes (the guest reset it), so does the deadline.
func TestTCPNextTimerFlowGone(t *testing.T) {
	h, f, _, start, _ := sackConn(t, Config{MTU: 1500, AckTimeout: time.Hour}, 4)
	h.now = h.now.Add(time.Millisecond)
	h.ack = start + 2800
	h.sendAck(nil)
	h.flush()
	if h.tab.NextTimer().IsZero() {
		t.Fatal("no timer with data in flight")
	}
	h.inject(h.frame(header.TCPFlagRST, h.seq, 0, 0, nil, nil))
	h.flush()
	if h.flow() != nil || len(h.tab.active) != 0 {
		t.Fatalf("the connection outlived the guest's RST (state %v)", f.state)
	}
	if next := h.tab.NextTimer(); !next.IsZero() {
		t.Fatalf("next timer in %v with no connection left, want none", next.Sub(h.now))
	}
}

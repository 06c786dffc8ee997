package tcp

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
)

// ackAll makes the guest acknowledge everything in segs.
func (h *tcpHarness) ackAll(segs []tcpSeg) {
	if len(segs) == 0 {
		return
	}
	l := segs[len(segs)-1]
	h.ack = l.seq + uint32(len(l.payload))
	if l.flags.Has(header.TCPFlagFIN) {
		h.ack++
	}
	h.sendAck(nil)
}

func hasFlag(ss []tcpSeg, fl header.TCPFlags) bool {
	for _, s := range ss {
		if s.flags.Has(fl) {
			return true
		}
	}
	return false
}

// TestTCPGuestCloseFirst: the guest's FIN half-closes the host socket (the
// peer reads EOF) while data still flows to the guest, the first of it
// carrying the FIN's ACK; the peer's FIN then reaches the guest after that
// data, and the guest's ACK of it ends the connection.
func TestTCPGuestCloseFirst(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	h.flush()
	h.sendAck([]byte("request"))
	h.sendFin()
	if got := h.flush(); len(got) != 0 {
		t.Fatalf("the FIN's ACK went before a frame could carry it: %s", segsString(got))
	}
	if h.stats.ConnsByState[stats.TCPClosing].Load() != 1 {
		t.Fatalf("not closing")
	}
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(peer)
	if err != nil || string(b) != "request" {
		t.Fatalf("peer read %q, %v (want EOF after the request)", b, err)
	}
	// Half-closed: the peer still answers.
	resp := guestframe.Pattern(5000)
	peer.Write(resp)
	peer.CloseWrite()
	all := h.collect("response and FIN", func(s []tcpSeg) bool { return hasFlag(s, header.TCPFlagFIN) })
	if !bytes.Equal(tcpPayloadOf(all), resp) {
		t.Fatalf("response corrupted")
	}
	if all[0].ack != h.seq {
		t.Fatalf("the response's first segment acknowledges %d, want the guest's FIN (%d)", all[0].ack, h.seq)
	}
	if fin := all[len(all)-1]; !fin.flags.Has(header.TCPFlagFIN) || len(fin.payload) != 0 {
		t.Fatalf("FIN not last: %+v", fin)
	}
	h.ackAll(all)
	h.flush()
	if h.tab.Len() != 0 || h.flow() != nil {
		t.Fatalf("connection kept after both FINs were acknowledged")
	}
	for s := range h.stats.ConnsByState {
		if h.stats.ConnsByState[s].Load() != 0 {
			t.Fatalf("gauge %s = %d", stats.TCPState(s), h.stats.ConnsByState[s].Load())
		}
	}
}

// TestTCPPeerCloseFirst: the host peer closes its side; the guest gets the
// data and a FIN, keeps sending (half-close the other way), then closes.
func TestTCPPeerCloseFirst(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	peer.Write([]byte("bye"))
	peer.CloseWrite()
	all := h.collect("FIN", func(s []tcpSeg) bool { return hasFlag(s, header.TCPFlagFIN) })
	if string(tcpPayloadOf(all)) != "bye" {
		t.Fatalf("got %q", tcpPayloadOf(all))
	}
	h.ackAll(all)
	h.flush()
	if h.flow() == nil {
		t.Fatalf("connection closed while the guest may still send")
	}
	h.sendAck([]byte("late data"))
	h.flush()
	if b := tcpReadN(t, peer, 9); string(b) != "late data" {
		t.Fatalf("peer got %q", b)
	}
	h.sendFin()
	h.flush()
	if h.flow() != nil {
		t.Fatalf("connection kept after the guest's FIN")
	}
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := peer.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("peer read after close: %v", err)
	}
}

// TestTCPGuestReset: a guest RST resets the host connection.
func TestTCPGuestReset(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	h.inject(h.frame(header.TCPFlagRST, h.seq, 0, 0, nil, nil))
	if h.flow() != nil || h.stats.RSTReceived.Load() != 1 {
		t.Fatalf("RST not handled")
	}
	if h.stats.Resets[stats.TCPGuestRST].Load() != 1 || sumReasons(&h.stats.Resets) != 1 {
		t.Fatalf("resets %v, want one guest_rst", reasonCounts(&h.stats.Resets))
	}
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := peer.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("peer read: %v, want connection reset", err)
	}
}

// TestTCPPeerReset: a host RST becomes an RST to the guest.
func TestTCPPeerReset(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	h.flush()
	peer.SetLinger(0)
	peer.Close()
	got := h.collect("RST", func(s []tcpSeg) bool { return hasFlag(s, header.TCPFlagRST) })
	if l := got[len(got)-1]; !l.flags.Has(header.TCPFlagRST) {
		t.Fatalf("RST not last")
	}
	if h.flow() != nil || h.stats.RSTSent.Load() != 1 {
		t.Fatalf("flow %v rst %d", h.flow() != nil, h.stats.RSTSent.Load())
	}
	if h.stats.Resets[stats.TCPHostReset].Load() != 1 || sumReasons(&h.stats.Resets) != 1 {
		t.Fatalf("resets %v, want one host_reset", reasonCounts(&h.stats.Resets))
	}
}

// TestTCPHandshakeTimeout: a host connect() that never completes is reset
// after HandshakeTimeout of the injected clock, not before.
func TestTCPHandshakeTimeout(t *testing.T) {
	h := tcpNewHarness(t, Config{HandshakeTimeout: 10 * time.Second})
	_, port := tcpBacklogFullListener(t)
	h.remote = netip.AddrPortFrom(netip.MustParseAddr("10.0.2.2"), port)
	h.sendSYN(tcpMss1400ws7)
	if next := h.tab.NextTimer(); !next.Equal(h.now.Add(10 * time.Second)) {
		t.Fatalf("next timer %v, want +10s", next.Sub(h.now))
	}
	h.tab.Timers(h.now.Add(9 * time.Second))
	if h.flow() == nil || len(h.flush()) != 0 {
		t.Fatalf("reset too early")
	}
	h.tab.Timers(h.now.Add(10 * time.Second))
	got := h.flush()
	if len(got) != 1 || !got[0].flags.Has(header.TCPFlagRST) || h.flow() != nil {
		t.Fatalf("no RST after the handshake timeout: %+v", got)
	}
	if h.stats.ConnectFailures[stats.TCPTimeout].Load() != 1 || sumReasons(&h.stats.ConnectFailures) != 1 {
		t.Fatalf("connect failures %v, want one timeout", reasonCounts(&h.stats.ConnectFailures))
	}
}

// TestTCPAckTimeoutBackoff: unacknowledged data is sent again after
// AckTimeout, then after twice that, and so on; after MaxRetrans the
// connection is reset.
func TestTCPAckTimeoutBackoff(t *testing.T) {
	h := tcpNewHarness(t, Config{AckTimeout: time.Second, MaxRetrans: 3})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	peer.Write([]byte("unacked"))
	first := h.collect("data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) > 0 })
	t0 := h.now
	at := t0
	for i, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		if next := h.tab.NextTimer(); !next.Equal(at.Add(wait)) {
			t.Fatalf("retry %d: next timer at %v, want %v", i, next.Sub(t0), at.Add(wait).Sub(t0))
		}
		h.tab.Timers(at.Add(wait - time.Millisecond))
		if len(h.flush()) != 0 {
			t.Fatalf("retry %d early", i)
		}
		at = at.Add(wait)
		h.now = at
		h.tab.Timers(at)
		re := h.flush()
		if string(tcpPayloadOf(re)) != "unacked" || re[0].seq != first[0].seq {
			t.Fatalf("retry %d: %+v", i, re)
		}
		if h.stats.Retransmits[stats.TCPRetransTimeout].Load() != uint64(i+1) {
			t.Fatalf("timeout retransmits %d", h.stats.Retransmits[stats.TCPRetransTimeout].Load())
		}
	}
	h.now = at.Add(8 * time.Second)
	h.tab.Timers(h.now)
	if got := h.flush(); !hasFlag(got, header.TCPFlagRST) || h.flow() != nil {
		t.Fatalf("no reset after MaxRetrans: %+v", got)
	}
}

// TestTCPIdleTimeout: a connection without activity is reset both ways
// after IdleTimeout; activity pushes the deadline out.
func TestTCPIdleTimeout(t *testing.T) {
	h := tcpNewHarness(t, Config{IdleTimeout: time.Hour})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	h.flush()
	h.now = h.now.Add(50 * time.Minute)
	h.sendAck([]byte("x")) // activity
	h.flush()
	h.tab.Timers(h.now.Add(59 * time.Minute))
	if h.flow() == nil {
		t.Fatalf("reset despite activity")
	}
	h.tab.Timers(h.now.Add(time.Hour))
	if got := h.flush(); !hasFlag(got, header.TCPFlagRST) || h.flow() != nil {
		t.Fatalf("idle connection not reset: %+v", got)
	}
	if h.stats.Resets[stats.TCPTimeout].Load() != 1 || sumReasons(&h.stats.Resets) != 1 {
		t.Fatalf("resets %v, want one timeout", reasonCounts(&h.stats.Resets))
	}
	tcpReadN(t, peer, 1)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := peer.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("peer not reset: %v", err)
	}
}

// TestTCPFinTimeout: once FINs went both ways, the connection must finish
// within FinTimeout (here the guest never acknowledges ours).
func TestTCPFinTimeout(t *testing.T) {
	h := tcpNewHarness(t, Config{FinTimeout: time.Minute})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	h.flush()
	h.sendFin()
	h.flush()
	peer.CloseWrite()
	h.collect("FIN", func(s []tcpSeg) bool { return hasFlag(s, header.TCPFlagFIN) })
	h.tab.Timers(h.now.Add(59 * time.Second))
	if h.flow() == nil {
		t.Fatalf("reset before the FIN timeout")
	}
	h.tab.Timers(h.now.Add(time.Minute))
	if got := h.flush(); !hasFlag(got, header.TCPFlagRST) || h.flow() != nil {
		t.Fatalf("half-closed connection not reset: %+v", got)
	}
}

// epollQuiet reports whether the table's epoll set stays silent for d. A
// wait a signal cut short (EINTR: the Go runtime's preemption, on a busy
// machine) goes on for the rest of d; it reported nothing.
func (h *tcpHarness) epollQuiet(d time.Duration) bool {
	h.t.Helper()
	var evs [8]unix.EpollEvent
	for end := time.Now().Add(d); ; {
		left := time.Until(end)
		if left <= 0 {
			return true
		}
		n, err := h.poll.Wait(evs[:], int(left/time.Millisecond)+1)
		switch {
		case errors.Is(err, unix.EINTR):
		case err != nil:
			h.t.Fatal(err)
		default:
			return n == 0
		}
	}
}

// TestTCPNoEventStorm: data waiting in the socket for a guest ACK, a peer
// FIN already passed on, and a fully shut socket waiting for the guest's
// last ACK produce no endless epoll events.
func TestTCPNoEventStorm(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	peer.Write([]byte("in flight"))
	h.collect("data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) > 0 })
	if !h.epollQuiet(50 * time.Millisecond) {
		t.Fatalf("events while all data is in flight")
	}
	peer.CloseWrite()
	all := h.collect("FIN", func(s []tcpSeg) bool { return hasFlag(s, header.TCPFlagFIN) })
	h.ackAll(all)
	h.flush()
	if !h.epollQuiet(50 * time.Millisecond) {
		t.Fatalf("events after the peer's FIN was passed on")
	}
	h.sendFin()
	h.flush()
	if h.flow() != nil {
		t.Fatalf("not closed")
	}
}

// TestTCPAckAfterRewind: an ACK for data sent before a timeout rewind is
// taken (the guest had it after all), and sending resumes after it.
func TestTCPAckAfterRewind(t *testing.T) {
	h := tcpNewHarness(t, Config{AckTimeout: time.Second, MTU: 1500})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	f := h.flow()
	start := f.seqToGuest
	peer.Write(guestframe.Pattern(2800))
	h.waitQueued(2800)
	h.w.free = 2
	h.pump(0)
	h.now = h.now.Add(time.Second)
	h.w.free = 1
	h.tab.Timers(h.now) // rewind, resend the first frame only
	if re := h.flush(); len(re) != 1 || re[0].seq != start {
		t.Fatalf("rewind resend: %+v", re)
	}
	// The guest ACKs both original frames.
	h.ack = start + 2800
	h.sendAck(nil)
	if f.seqToGuest != start+2800 || f.inFlight() != 0 || h.queued() != 0 {
		t.Fatalf("seqToGuest %d inFlight %d queued %d", f.seqToGuest-start, f.inFlight(), h.queued())
	}
	peer.Write([]byte("next"))
	h.w.free = 10
	got := h.collect("next", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) > 0 })
	if got[0].seq != start+2800 || string(tcpPayloadOf(got)) != "next" {
		t.Fatalf("after ACK: seq %d %q", got[0].seq-start, tcpPayloadOf(got))
	}
}

// TestTCPHalfClosedQuietNotReset: a guest FIN half-closes the connection;
// the host peer, still open, may stay quiet for longer than FinTimeout and
// answer later. Only the idle timeout applies until FINs went both ways.
func TestTCPHalfClosedQuietNotReset(t *testing.T) {
	h := tcpNewHarness(t, Config{FinTimeout: time.Minute, IdleTimeout: time.Hour})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	h.flush()
	h.sendFin()
	h.flush()
	h.tab.Timers(h.now.Add(61 * time.Second))
	if got := h.flush(); hasFlag(got, header.TCPFlagRST) || h.flow() == nil {
		t.Fatalf("half-closed connection reset after 61 s of quiet: %+v", got)
	}
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := peer.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("peer read: %v, want EOF (half-closed, not reset)", err)
	}
	if _, err := peer.Write([]byte("late")); err != nil {
		t.Fatalf("peer write: %v", err)
	}
	h.now = h.now.Add(62 * time.Second)
	got := h.collect("late answer", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= 4 })
	if string(tcpPayloadOf(got)) != "late" || hasFlag(got, header.TCPFlagRST) {
		t.Fatalf("guest got %q", tcpPayloadOf(got))
	}
	h.tab.Timers(h.now.Add(61 * time.Minute))
	if got := h.flush(); !hasFlag(got, header.TCPFlagRST) || h.flow() != nil {
		t.Fatalf("idle half-closed connection not reset after IdleTimeout: %+v", got)
	}
}

// TestTCPResettingFlowReleasedDespiteGuestTraffic: a reset waits for an RX
// buffer for its RST. A guest that keeps sending but never refills RX does
// not keep the slot: it is released FinTimeout after the reset.
func TestTCPResettingFlowReleasedDespiteGuestTraffic(t *testing.T) {
	h := tcpNewHarness(t, Config{FinTimeout: time.Minute, IdleTimeout: time.Hour})
	ln := h.listen()
	h.establish(ln, tcpMss1400ws7)
	h.flush()
	h.w.free = 0
	h.now = h.now.Add(time.Hour)
	h.tab.Timers(h.now) // idle timeout: reset
	if got := h.flush(); len(got) != 0 || !h.blocked {
		t.Fatalf("RST went out without a buffer: %+v", got)
	}
	f := h.flow()
	if f == nil || f.state != stats.TCPResetting {
		t.Fatalf("not resetting")
	}
	for i := 1; i <= 7; i++ {
		h.now = h.now.Add(10 * time.Second)
		if h.flow() != nil {
			h.sendAck([]byte("x"))
		}
		h.tab.Timers(h.now)
		h.flush()
	}
	if h.flow() != nil || h.tab.Len() != 0 {
		t.Fatalf("resetting flow kept its slot 70 s after the reset")
	}
}

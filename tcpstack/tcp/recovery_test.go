package tcp

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
)

// tcpSendWindow has the peer send n frames of 1400 bytes and returns them
// as the guest got them, with the data.
func (h *tcpHarness) tcpSendWindow(peer interface{ Write([]byte) (int, error) }, n int) ([]tcpSeg, []byte) {
	h.t.Helper()
	data := guestframe.Pattern(n * 1400)
	peer.Write(data)
	h.waitQueued(len(data) + h.queuedBeyond())
	got := h.collect("window", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(data) })
	if len(got) != n {
		h.t.Fatalf("%d frames for %d bytes, want %d", len(got), len(data), n)
	}
	return got, data
}

// queuedBeyond is what the socket holds that the guest has not
// acknowledged yet (already sent to it).
func (h *tcpHarness) queuedBeyond() int { return int(h.flow().inFlight()) }

// dataFrames counts frames with payload and the payload bytes.
func dataFrames(ss []tcpSeg) (frames, bytes int) {
	for _, s := range ss {
		if len(s.payload) > 0 {
			frames++
			bytes += len(s.payload)
		}
	}
	return
}

// TestTCPRecoveryPointNoAmplification: a 20-frame window whose first frame
// the guest lost; it repeats its ACK for each of the 19 that arrived, two
// per TX batch. The first two repeats rewind once and the 20 frames go
// again; the other 17 are for data sent before that rewind (the ACK does
// not pass the recovery point, the highest sequence sent then) and are
// ignored (main rewound on every second one: 9 rewinds, 180 frames). The
// guest's full ACK ends the recovery; duplicates the resent copies
// provoke, at that ACK, still rewind nothing; a later loss does.
func TestTCPRecoveryPointNoAmplification(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500, AckTimeout: time.Hour})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	f := h.flow()
	start := f.seqToGuest
	first, data := h.tcpSendWindow(peer, 20)
	if first[0].seq != start {
		t.Fatalf("window starts at %d", first[0].seq-start)
	}
	var resent []tcpSeg
	for i := 0; i < 19; i++ {
		h.sendAck(nil) // ack = start: frame 0 is missing
		if i%2 == 1 || i == 18 {
			resent = append(resent, h.flush()...)
		}
	}
	rewinds := h.stats.Retransmits[stats.TCPRetransDupAck].Load()
	frames, n := dataFrames(resent)
	t.Logf("19 duplicate ACKs: %d rewinds, %d frames (%d bytes) resent", rewinds, frames, n)
	if rewinds != 1 || frames != 20 || n != len(data) {
		t.Fatalf("19 duplicate ACKs: %d rewinds and %d frames resent, want 1 and 20", rewinds, frames)
	}
	if resent[0].seq != start || !bytes.Equal(tcpPayloadOf(resent), data) {
		t.Fatalf("resent from %d, or other bytes", resent[0].seq-start)
	}
	// The retransmission fills the hole: the guest acknowledges all 20.
	// The 19 resent copies it already had make it repeat that ACK: no
	// rewind, though new data is in flight.
	h.ack = start + uint32(len(data))
	h.sendAck(nil)
	more, _ := h.tcpSendWindow(peer, 4)
	if more[0].seq != h.ack {
		t.Fatalf("new data at %d", more[0].seq-start)
	}
	var after []tcpSeg
	for i := 0; i < 19; i++ {
		h.sendAck(nil)
		after = append(after, h.flush()...)
	}
	if fr, _ := dataFrames(after); fr != 0 || h.stats.Retransmits[stats.TCPRetransDupAck].Load() != 1 {
		t.Fatalf("duplicates at the recovery point resent %d frames (rewinds %d)", fr, h.stats.Retransmits[stats.TCPRetransDupAck].Load())
	}
	// A loss in the new data (ACK past the recovery point) is repaired.
	h.ack += 1400
	h.sendAck(nil)
	h.sendAck(nil)
	h.sendAck(nil)
	re := h.flush()
	if fr, _ := dataFrames(re); fr != 3 || re[0].seq != h.ack || h.stats.Retransmits[stats.TCPRetransDupAck].Load() != 2 {
		t.Fatalf("loss after the recovery: %d frames, rewinds %d", fr, h.stats.Retransmits[stats.TCPRetransDupAck].Load())
	}
}

// TestTCPZeroWindowReopenResendsAtOnce: with 5 frames in flight the guest
// shuts its window (ignored: some guests do that transiently) and then
// reopens it, acknowledging nothing: it dropped those frames. They go
// again at once, not at the 2 s ACK timeout (main sent nothing until
// then).
func TestTCPZeroWindowReopenResendsAtOnce(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500, AckTimeout: 2 * time.Second})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	start := h.flow().seqToGuest
	_, data := h.tcpSendWindow(peer, 5)
	wnd := h.wnd
	h.wnd = 0
	h.sendAck(nil)
	if got := h.flush(); len(tcpPayloadOf(got)) != 0 {
		t.Fatalf("data sent into the zero window: %d bytes", len(tcpPayloadOf(got)))
	}
	h.wnd = wnd
	h.sendAck(nil) // the same ACK, the window open again
	re := h.flush()
	if fr, _ := dataFrames(re); fr != 5 || re[0].seq != start || !bytes.Equal(tcpPayloadOf(re), data) {
		t.Fatalf("after the window reopened: %d frames, want the 5 again at once", fr)
	}
	if n := h.stats.Retransmits[stats.TCPRetransWindow].Load(); n != 1 {
		t.Fatalf("window_reopened rewinds %d", n)
	}
}

// TestTCPRSTAfterRewindUsesSndMax: a connection rewound by the ACK timeout
// and reset before it could send again resets the guest at the highest
// sequence it sent, which the guest may have received all of (main used
// the rewound sequence, below the guest's next expected byte: dropped).
func TestTCPRSTAfterRewindUsesSndMax(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500, AckTimeout: time.Second})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	f := h.flow()
	start := f.seqToGuest
	h.tcpSendWindow(peer, 5)
	h.w.free = 0
	h.now = h.now.Add(time.Second)
	h.tab.Timers(h.now)
	h.flush()
	if f.seqToGuest != start || f.sndMax != start+5*1400 {
		t.Fatalf("not rewound: seqToGuest %d sndMax %d", f.seqToGuest-start, f.sndMax-start)
	}
	peer.SetLinger(0)
	peer.Close()
	h.w.free = 100
	rst := h.collect("RST", func(s []tcpSeg) bool { return hasFlag(s, header.TCPFlagRST) })
	last := rst[len(rst)-1]
	if !last.flags.Has(header.TCPFlagRST) || last.seq != start+5*1400 {
		t.Fatalf("RST at %d, want sndMax %d", last.seq-start, 5*1400)
	}
}

// TestTCPGapDupAcksNameNextByte: where ACKs to the guest follow what the
// host peer acknowledged, they lag what was written; the duplicate ACKs
// that announce a gap in the guest's data must still name the next byte
// the guest is to send (main repeated the lagging ACK, which the guest
// takes for an old one, not a request).
func TestTCPGapDupAcksNameNextByte(t *testing.T) {
	h, f, chunk := lagPeerAcks(t)
	next := f.seqFromGuest
	h.inject(h.frame(header.TCPFlagACK, next+1000, h.ack, h.wnd, nil, chunk[:1000]))
	got := h.flush()
	if len(got) < dupAcksToSend+1 {
		t.Fatalf("%d frames for a gap, want %d ACKs", len(got), dupAcksToSend+1)
	}
	for _, s := range got {
		if len(s.payload) != 0 || s.ack != next {
			t.Fatalf("gap ACK acknowledges %d (%d bytes of payload), want the next byte %d", s.ack-h.isn, len(s.payload), next-h.isn)
		}
	}
}

// TestTCPDefaultMSSPerFamily: a guest SYN without an MSS option gets
// segments of 536 bytes over IPv4 and 1220 over IPv6 (main used 536 for
// both).
func TestTCPDefaultMSSPerFamily(t *testing.T) {
	for _, c := range []struct {
		v6  bool
		mss int
	}{{false, 536}, {true, 1220}} {
		h := tcpNewHarness(t, Config{})
		var ln interface{ Close() error }
		var peer interface{ Write([]byte) (int, error) }
		if c.v6 {
			h.tcpGuest6()
			l := h.listen6()
			ln, peer = l, h.establish(l, header.TCPOptions{})
		} else {
			l := h.listen()
			ln, peer = l, h.establish(l, header.TCPOptions{})
		}
		_ = ln
		data := guestframe.Pattern(5000)
		peer.Write(data)
		got := h.collect("data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(data) })
		if len(got[0].payload) != c.mss || !bytes.Equal(tcpPayloadOf(got), data) {
			t.Fatalf("v6 %v: segments of %d bytes, want %d", c.v6, len(got[0].payload), c.mss)
		}
	}
}

// TestTCPGuestRSTChecked: a guest RST counts only at exactly the next
// sequence expected (RFC 5961 §3): one elsewhere in the window gets a
// challenge ACK naming that sequence, one outside it is dropped; neither
// touches the connection (main reset it on any RST).
func TestTCPGuestRSTChecked(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	f := h.flow()
	h.flush()
	h.inject(h.frame(header.TCPFlagRST, h.seq+1000, 0, 0, nil, nil))
	ch := h.flush()
	if h.flow() != f || len(ch) != 1 || ch[0].flags != header.TCPFlagACK || ch[0].ack != h.seq {
		t.Fatalf("in-window RST: flow %v, answer %+v, want a challenge ACK at %d", h.flow() != nil, ch, h.seq-h.isn)
	}
	h.inject(h.frame(header.TCPFlagRST, h.seq-5000, 0, 0, nil, nil))
	h.inject(h.frame(header.TCPFlagRST, h.seq+1<<30, 0, 0, nil, nil))
	if out := h.flush(); h.flow() != f || len(out) != 0 {
		t.Fatalf("out-of-window RSTs: flow kept %v, answered %+v", h.flow() == f, out)
	}
	// The connection still works, then an exact RST ends it.
	h.sendAck([]byte("ping"))
	h.flush()
	if b := tcpReadN(t, peer, 4); string(b) != "ping" {
		t.Fatalf("peer got %q", b)
	}
	h.inject(h.frame(header.TCPFlagRST, h.seq, 0, 0, nil, nil))
	if h.flow() != nil || h.stats.RSTReceived.Load() != 1 {
		t.Fatalf("exact RST did not reset (received %d)", h.stats.RSTReceived.Load())
	}
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := peer.Read(make([]byte, 1)); err == nil {
		t.Fatalf("host peer not reset")
	}
}

// TestTCPZeroWindowProbe: the guest shuts its window with nothing in
// flight while the host peer has data for it. If the guest's window
// update were lost, nothing would reopen it: an ACK one below the next
// sequence is sent after the ACK timeout, again at twice the interval,
// and the guest's answer with an open window lets the data flow (main
// never probed).
func TestTCPZeroWindowProbe(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500, AckTimeout: time.Second})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	f := h.flow()
	h.flush()
	wnd := h.wnd
	h.wnd = 0
	h.sendAck(nil) // window shut, nothing in flight
	h.flush()
	data := guestframe.Pattern(3000)
	peer.Write(data)
	h.waitQueued(len(data))
	if got := h.pump(10 * time.Millisecond); len(got) != 0 {
		t.Fatalf("sent %d frames into a shut window", len(got))
	}
	probe := func(at time.Duration) tcpSeg {
		t.Helper()
		h.now = h.now.Add(at - time.Millisecond)
		h.tab.Timers(h.now)
		if got := h.flush(); len(got) != 0 {
			t.Fatalf("probe before its time: %+v", got)
		}
		h.now = h.now.Add(time.Millisecond)
		h.tab.Timers(h.now)
		got := h.flush()
		if len(got) != 1 || got[0].flags != header.TCPFlagACK || len(got[0].payload) != 0 || got[0].seq != f.seqToGuest-1 {
			t.Fatalf("want one probe at %d, got %+v", f.seqToGuest-1-h.isn, got)
		}
		return got[0]
	}
	probe(time.Second)
	probe(2 * time.Second)
	if n := h.stats.WindowProbes.Load(); n != 2 {
		t.Fatalf("%d probes counted", n)
	}
	// The guest answers the probe with its open window.
	h.wnd = wnd
	h.sendAck(nil)
	got := h.collect("data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(data) })
	if !bytes.Equal(tcpPayloadOf(got), data) {
		t.Fatalf("data after the window opened differs")
	}
}

// TestTCPZeroWindowInFlightGuestAnswers: the guest takes one segment of a
// flight, drops the rest for lack of memory and shuts its window (a Linux
// guest does when it runs out of receive memory), and answers every resend
// the same way for longer than the retransmissions allowed. It is alive:
// the connection stays, and the data flows once the window opens. A guest
// that stops answering is still reset (before, the answering guest was
// reset too, after 9 resends: about 2.7 minutes; found by review).
func TestTCPZeroWindowInFlightGuestAnswers(t *testing.T) {
	for _, answers := range []bool{true, false} {
		t.Run(fmt.Sprintf("answers=%v", answers), func(t *testing.T) {
			h := tcpNewHarness(t, Config{MTU: 1500})
			peer := h.establish(h.listen(), tcpMss1400ws7)
			f := h.flow()
			h.flush()
			data := guestframe.Pattern(4000)
			peer.Write(data)
			got := h.collect("data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(data) })
			wnd := h.wnd
			h.ack, h.wnd = got[0].seq+1400, 0 // took one segment, no memory for the rest
			h.sendAck(nil)
			h.flush()
			rounds := h.tab.maxRetrans(f) + 5
			for i := 0; i < rounds && f.state == stats.TCPEstablished; i++ {
				h.now = h.tab.deadline(f)
				h.tab.Timers(h.now)
				resent := h.flush()
				if answers && len(tcpPayloadOf(resent)) > 1400 {
					t.Fatalf("resend %d into the shut window: %d bytes, want one segment", i, len(tcpPayloadOf(resent)))
				}
				if len(resent) > 0 && answers {
					h.sendAck(nil) // the same ACK, the window still shut
					h.flush()
				}
			}
			if !answers {
				if f.state == stats.TCPEstablished {
					t.Fatalf("a silent guest not reset after %d ACK timeouts", rounds)
				}
				return
			}
			if f.state != stats.TCPEstablished {
				t.Fatalf("a guest answering every resend was reset (state %v)", f.state)
			}
			h.wnd = wnd // memory again: the rest goes
			h.sendAck(nil)
			rest := h.collect("the rest", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(data)-1400 })
			if !bytes.Equal(tcpPayloadOf(rest)[:len(data)-1400], data[1400:]) {
				t.Fatal("the rest of the data differs")
			}
		})
	}
}

// TestTCPZeroWindowProbeForPeerFin: the guest shuts its window with
// nothing in flight and the host peer closes, with no data behind: only
// its FIN waits for the guest. The window is probed all the same (if the
// guest's window update were lost, the FIN would wait for the idle
// timeout), and once the guest opens it our FIN goes (before, nothing was
// probed: SIOCINQ does not count a FIN; found by review).
func TestTCPZeroWindowProbeForPeerFin(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500, AckTimeout: time.Second})
	peer := h.establish(h.listen(), tcpMss1400ws7)
	f := h.flow()
	h.flush()
	data := guestframe.Pattern(1000)
	peer.Write(data)
	got := h.collect("data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(data) })
	last := got[len(got)-1]
	wnd := h.wnd
	h.ack, h.wnd = last.seq+uint32(len(last.payload)), 0 // all taken, window shut
	h.sendAck(nil)
	h.flush()
	peer.CloseWrite()
	time.Sleep(20 * time.Millisecond)
	h.pump(10 * time.Millisecond)
	probed := false
	for i := 0; i < 8 && !probed; i++ {
		h.now = h.now.Add(70 * time.Second)
		h.tab.Timers(h.now)
		for _, s := range h.flush() {
			if s.flags == header.TCPFlagACK && len(s.payload) == 0 && s.seq == f.seqToGuest-1 {
				probed = true
			}
		}
	}
	if !probed {
		t.Fatal("no zero-window probe in 9 minutes with the peer's FIN pending")
	}
	h.wnd = wnd // the answer opens the window
	h.sendAck(nil)
	h.collect("our FIN", func(s []tcpSeg) bool { return hasFlag(s, header.TCPFlagFIN) })
}

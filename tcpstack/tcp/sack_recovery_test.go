package tcp

import (
	"bytes"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
)

// The harness's clock (h.now) only moves when a test moves it: a
// retransmission seen without moving it did not wait for any timer.

var tcpMss1400ws7SACK = header.TCPOptions{HasMSS: true, MSS: 1400, HasWindowScale: true, WindowScale: 7, SACKPermitted: true}

// sendSACK sends a pure ACK from the guest's state carrying SACK blocks
// (absolute sequence ranges [start, end)).
func (h *tcpHarness) sendSACK(blocks ...[2]uint32) {
	h.t.Helper()
	o := header.TCPOptions{NumSACKBlocks: len(blocks)}
	for i, b := range blocks {
		o.SACKBlocks[i] = header.TCPSACKBlock{Start: b[0], End: b[1]}
	}
	var ob [40]byte
	n := header.EncodeTCPOptions(ob[:], &o)
	h.inject(h.frame(header.TCPFlagACK, h.seq, h.ack, h.wnd, ob[:n], nil))
}

// sackConn establishes a SACK connection and has the peer send n frames
// of 1400 bytes, all taken by the guest's ring. It returns the peer's
// connection, the first sequence and the data.
func sackConn(t *testing.T, cfg Config, n int) (*tcpHarness, *conn, interface{ Write([]byte) (int, error) }, uint32, []byte) {
	t.Helper()
	h := tcpNewHarness(t, cfg)
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7SACK)
	f := h.flow()
	if !h.tab.sackOK(f) {
		t.Fatal("SACK not negotiated")
	}
	start := f.seqToGuest
	got, data := h.tcpSendWindow(peer, n)
	if got[0].seq != start {
		t.Fatalf("flight starts at %d", got[0].seq-start)
	}
	return h, f, peer, start, data
}

func retransmits(h *tcpHarness) [stats.NumTCPRetransCauses]uint64 {
	var r [stats.NumTCPRetransCauses]uint64
	for i := range r {
		r[i] = h.stats.Retransmits[i].Load()
	}
	return r
}

// TestTCPSACKFastRetransmitHole: the guest lost the third of ten frames
// and says so as a Linux guest does, with an ACK at the hole that SACKs
// what came after it and a window that grows with that out-of-order data.
// On the third such ACK (not before: one frame held back would show
// twice), exactly the missing 1400 bytes go again, at their sequence, with
// no timer: nothing SACKed is sent again, seqToGuest stays where new data
// continues. An ACK that SACKs nothing new (a D-SACK for a duplicate
// frame) does not count. main ignored these ACKs (the window moved) until
// its 2 s ACK timeout, then sent the whole flight again.
func TestTCPSACKFastRetransmitHole(t *testing.T) {
	h, f, peer, start, data := sackConn(t, Config{MTU: 1500}, 10)
	end := start + uint32(len(data))
	h.ack = start + 2800
	h.sendAck(nil) // frames 0 and 1
	h.flush()
	dsack := [2]uint32{start, start + 1400} // a duplicate of frame 0
	for i := 3; i < 10; i++ {
		h.wnd += 100 // the window grows with out-of-order data
		h.sendSACK([2]uint32{start + 4200, start + uint32(1400*(i+1))})
		if i == 4 {
			h.sendSACK(dsack, [2]uint32{start + 4200, start + uint32(1400*(i+1))}) // nothing new
		}
		got := h.flush()
		frames, _ := dataFrames(got)
		switch {
		case i < 5 && frames != 0:
			t.Fatalf("duplicate ACK %d (of 3): %d frames sent again", i-2, frames)
		case i == 5:
			if frames != 1 {
				t.Fatalf("third duplicate ACK: %d frames sent again, want 1 (the hole)", frames)
			}
			var s tcpSeg
			for _, x := range got {
				if len(x.payload) > 0 {
					s = x
				}
			}
			if s.seq != start+2800 || !bytes.Equal(s.payload, data[2800:4200]) {
				t.Fatalf("resent %d bytes at %d, want data[2800:4200] at 2800", len(s.payload), s.seq-start)
			}
		case i > 5 && frames != 0:
			t.Fatalf("duplicate ACK %d: %d frames sent again after the hole went", i-2, frames)
		}
		if f.seqToGuest != end || f.sndMax != end {
			t.Fatalf("seqToGuest %d, sndMax %d: moved from %d", f.seqToGuest-start, f.sndMax-start, len(data))
		}
	}
	r := retransmits(h)
	if r[stats.TCPRetransSACK] != 1 || r[stats.TCPRetransDupAck] != 0 || r[stats.TCPRetransTimeout] != 0 {
		t.Fatalf("retransmissions %v, want one SACK recovery", r)
	}
	// The hole is filled: the guest has everything; the recovery is over
	// and new data follows from the end of the flight.
	h.ack = end
	h.sendAck(nil)
	if f.sackRecovery {
		t.Fatal("still recovering after the full ACK")
	}
	more, _ := h.tcpSendWindow(peer, 2)
	if more[0].seq != end {
		t.Fatalf("new data at %d, want %d", more[0].seq-start, len(data))
	}
}

// TestTCPSACKResendLostAgain: the hole went again and was lost again.
// ACKs that SACK data sent after that resend, with the hole still open,
// show it: on the third, the hole goes once more.
func TestTCPSACKResendLostAgain(t *testing.T) {
	h, f, peer, start, data := sackConn(t, Config{MTU: 1500}, 6)
	for i := 1; i < 4; i++ { // frame 0 lost
		h.sendSACK([2]uint32{start + 1400, start + uint32(1400*(i+1))})
	}
	if fr, _ := dataFrames(h.flush()); fr != 1 || !f.sackRecovery {
		t.Fatalf("%d frames resent, recovering %v", fr, f.sackRecovery)
	}
	// New data goes after the resend, which the guest did not get.
	more, _ := h.tcpSendWindow(peer, 4)
	end := start + uint32(len(data))
	if more[0].seq != end {
		t.Fatalf("new data at %d", more[0].seq-start)
	}
	for i := 1; i <= 3; i++ {
		h.sendSACK([2]uint32{start + 1400, end + uint32(1400*i)})
		got := h.flush()
		fr, _ := dataFrames(got)
		if i < 3 && fr != 0 {
			t.Fatalf("ACK %d past the resend: %d frames sent again", i, fr)
		}
		if i == 3 {
			if fr != 1 || got[0].seq != start || !bytes.Equal(got[0].payload, data[:1400]) {
				t.Fatalf("third ACK past the resend: %d frames, first at %d; want frame 0 again", fr, got[0].seq-start)
			}
		}
	}
	if r := retransmits(h); r[stats.TCPRetransSACK] != 2 || r[stats.TCPRetransTimeout] != 0 {
		t.Fatalf("retransmissions %v, want two SACK recoveries", r)
	}
}

// TestTCPSACKTailLoss: the last two of four frames are lost and the socket
// has nothing more: no ACK can come to show it. Two round trips after the
// guest's last ACK progress (the probe timeout, 10 ms at least; far below
// the 200 ms RTO floor, and AckTimeout is an hour here), the last segment
// goes again; the guest SACKs it, and since it has everything after the
// hole and nothing more can be sent, the hole goes at once, with nothing
// SACKed in it.
func TestTCPSACKTailLoss(t *testing.T) {
	h, f, _, start, data := sackConn(t, Config{MTU: 1500, AckTimeout: time.Hour}, 4)
	end := start + uint32(len(data))
	h.ack = start + 2800
	h.sendAck(nil) // an RTT sample: the probe timer can be set
	h.flush()
	if f.srtt == 0 || !f.sendsNothing() {
		t.Fatalf("srtt %v, nothing more to send %v", f.srtt, f.sendsNothing())
	}
	h.now = h.now.Add(minPTO - time.Millisecond)
	h.tab.Timers(h.now)
	if fr, _ := dataFrames(h.flush()); fr != 0 {
		t.Fatalf("probe before its timeout: %d frames", fr)
	}
	h.now = h.now.Add(time.Millisecond)
	h.tab.Timers(h.now)
	probe := h.flush()
	if fr, _ := dataFrames(probe); fr != 1 || probe[0].seq != end-1400 || !bytes.Equal(probe[0].payload, data[4200:]) {
		t.Fatalf("probe: %d frames, first at %d; want the last 1400 bytes", fr, probe[0].seq-start)
	}
	h.sendSACK([2]uint32{end - 1400, end})
	got := h.flush()
	if fr, _ := dataFrames(got); fr != 1 || got[0].seq != start+2800 || !bytes.Equal(got[0].payload, data[2800:4200]) {
		t.Fatalf("after the probe's SACK: %d frames, first at %d; want data[2800:4200]", fr, got[0].seq-start)
	}
	r := retransmits(h)
	if r[stats.TCPRetransTailProbe] != 1 || r[stats.TCPRetransSACK] != 1 || r[stats.TCPRetransTimeout] != 0 {
		t.Fatalf("retransmissions %v", r)
	}
}

// TestTCPRTOFollowsRTT: once the guest's ACKs gave a round trip, the ACK
// timeout is the measured RTO (200 ms at least), not AckTimeout; before
// any sample it is AckTimeout. Without SACK, so that no probe comes first.
func TestTCPRTOFollowsRTT(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500, AckTimeout: 2 * time.Second})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	f := h.flow()
	if got := h.tab.ackTimeout(f); got != 2*time.Second {
		t.Fatalf("ACK timeout %v before any sample, want AckTimeout", got)
	}
	start := f.seqToGuest
	h.tcpSendWindow(peer, 2)
	h.now = h.now.Add(time.Millisecond)
	h.ack = start + 1400
	h.sendAck(nil)
	h.flush()
	if f.srtt != time.Millisecond {
		t.Fatalf("srtt %v, want the 1 ms the ACK took", f.srtt)
	}
	h.now = h.now.Add(minRTO - time.Millisecond)
	h.tab.Timers(h.now)
	if fr, _ := dataFrames(h.flush()); fr != 0 {
		t.Fatalf("%d frames resent before the RTO", fr)
	}
	h.now = h.now.Add(time.Millisecond)
	h.tab.Timers(h.now)
	got := h.flush()
	if fr, _ := dataFrames(got); fr != 1 || got[0].seq != start+1400 || h.stats.Retransmits[stats.TCPRetransTimeout].Load() != 1 {
		t.Fatalf("at the RTO: %d frames, timeouts %d", fr, h.stats.Retransmits[stats.TCPRetransTimeout].Load())
	}
	// A silent guest is given up on no sooner than with AckTimeout first:
	// 200 ms doubled 4 times reaches 2 s, then MaxRetrans more.
	if got, want := h.tab.maxRetrans(f), h.tab.cfg.MaxRetrans+4; got != want {
		t.Fatalf("maxRetrans %d, want %d", got, want)
	}
}

// TestTCPTailProbeBlockedThenAcked: a tail probe that finds no RX buffer
// masks EPOLLIN (the flow waits for buffers); an ACK for everything then
// cancels the probe, with the socket drained. The wait must end with it:
// host data that comes afterwards reaches the guest (it never did, found
// by review).
func TestTCPTailProbeBlockedThenAcked(t *testing.T) {
	h, f, peer, start, data := sackConn(t, Config{MTU: 1500, AckTimeout: time.Hour}, 4)
	end := start + uint32(len(data))
	h.ack = start + 2800
	h.sendAck(nil)
	h.flush()
	if !f.drained {
		t.Fatalf("not drained")
	}
	h.w.free = 0 // ring empty (another flow took it)
	h.now = h.now.Add(minPTO)
	h.tab.Timers(h.now)
	h.flush()
	// The guest's (delayed) ACK for everything arrives; the guest refills.
	h.ack = end
	h.sendAck(nil)
	h.w.free = 1 << 20
	h.flush()
	more := []byte("server push after a pause")
	peer.Write(more)
	got := h.pumpPayload(len(more), 2*time.Second)
	if len(got) != len(more) {
		t.Fatalf("host data after the ACK: %d bytes reached the guest, want %d (rxBlocked=%v drained=%v)", len(got), len(more), f.flags&flRxBlocked != 0, f.drained)
	}
}

// TestTCPSACKResendBlockedThenAcked: the same with a SACK recovery's resend
// that found no RX buffer.
func TestTCPSACKResendBlockedThenAcked(t *testing.T) {
	h, f, peer, start, data := sackConn(t, Config{MTU: 1500, AckTimeout: time.Hour}, 4)
	end := start + uint32(len(data))
	h.ack = start // a window update: its pass reads the socket empty
	h.wnd--
	h.sendAck(nil)
	h.flush()
	if !f.drained {
		t.Fatal("not drained: the test would not reach the stall it guards against")
	}
	h.w.free = 0
	for i := 1; i < 4; i++ {
		h.sendSACK([2]uint32{start + 1400, start + uint32(1400*(i+1))})
	}
	h.flush()
	h.ack = end
	h.sendAck(nil)
	h.w.free = 1 << 20
	h.flush()
	more := []byte("more")
	peer.Write(more)
	got := h.pumpPayload(len(more), 2*time.Second)
	if len(got) != len(more) {
		t.Fatalf("host data after the ACK: %d bytes, want %d (rxBlocked=%v drained=%v)", len(got), len(more), f.flags&flRxBlocked != 0, f.drained)
	}
}

// TestTCPTailProbeLoneSegmentWaitsForDelayedACK: with one segment in
// flight, the probe allows for the guest's delayed ACK (RFC 8985's
// WCDelAckT): none at the two round trips that would do for a longer
// flight, nor at a Linux guest's 40 ms delayed ACK; one by the RTO.
func TestTCPTailProbeLoneSegmentWaitsForDelayedACK(t *testing.T) {
	h, f, _, start, data := sackConn(t, Config{MTU: 1500, AckTimeout: time.Hour}, 2)
	h.now = h.now.Add(time.Millisecond)
	h.ack = start + 1400
	h.sendAck(nil) // an RTT sample; one segment left in flight
	h.flush()
	if f.srtt == 0 || f.inFlight() != 1400 {
		t.Fatalf("srtt %v, in flight %d", f.srtt, f.inFlight())
	}
	for _, d := range []time.Duration{minPTO, 40 * time.Millisecond} {
		h.tab.Timers(h.now.Add(d))
		if fr, _ := dataFrames(h.flush()); fr != 0 {
			t.Fatalf("a lone segment probed %v after the ACK", d)
		}
	}
	h.now = h.now.Add(h.tab.rto(f))
	h.tab.Timers(h.now)
	probe := h.flush()
	if fr, _ := dataFrames(probe); fr != 1 || !bytes.Equal(probe[0].payload, data[1400:]) {
		t.Fatalf("no probe of the lone segment by the RTO: %d frames", fr)
	}
}

// TestTCPResendNotTimed: bytes sent again after a rewind are not timed
// (Karn): the ACK for their first copy would give a round trip too short.
func TestTCPResendNotTimed(t *testing.T) {
	h, f, _, _, _ := sackConn(t, Config{MTU: 1500, AckTimeout: time.Hour}, 3)
	h.tab.rewind(h.now, f, stats.TCPRetransTimeout)
	if fr, _ := dataFrames(h.flush()); fr != 3 {
		t.Fatalf("%d frames sent again, want 3", fr)
	}
	if !f.rttAt.IsZero() {
		t.Fatalf("a resent byte is being timed (seq %d)", f.rttSeq)
	}
}

// TestTCPTailProbeBeforeFIN: the host peer sent its last bytes and closed;
// our FIN followed them, and the guest got neither the last two frames
// nor the FIN. The tail probe still goes after its timeout (the last
// segment again, not the FIN), so the guest's SACK starts the recovery
// instead of the ACK timeout. Before, reaching the socket's EOF did not
// count as having nothing more to send, and no probe was armed.
func TestTCPTailProbeBeforeFIN(t *testing.T) {
	h, f, peer, start, data := sackConn(t, Config{MTU: 1500, AckTimeout: time.Hour}, 4)
	end := start + uint32(len(data))
	h.peerCloses(peer)
	if !f.has(evGuestFinSent) || f.seqToGuest != end+1 {
		t.Fatalf("FIN not sent: events %#x, seqToGuest at %d", f.events, f.seqToGuest-start)
	}
	h.ack = start + 2800
	h.sendAck(nil) // an RTT sample: the probe timer can be set
	h.flush()
	if !h.tab.tlpArmed(f) {
		t.Fatalf("no tail probe armed with the last frames and the FIN in flight (sends nothing %v, srtt %v)", f.sendsNothing(), f.srtt)
	}
	h.now = h.now.Add(h.tab.pto(f))
	h.tab.Timers(h.now)
	probe := h.flush()
	if fr, _ := dataFrames(probe); fr != 1 || probe[0].seq != end-1400 || !bytes.Equal(probe[0].payload, data[4200:]) {
		t.Fatalf("probe: %d data frames in %d; want the last 1400 bytes at %d", fr, len(probe), len(data)-1400)
	}
	// The guest SACKs the probe: it has everything after the hole, and
	// nothing but the FIN is left to send, so the hole goes at once.
	h.sendSACK([2]uint32{end - 1400, end})
	got := h.flush()
	if fr, _ := dataFrames(got); fr != 1 || got[0].seq != start+2800 || !bytes.Equal(got[0].payload, data[2800:4200]) {
		t.Fatalf("after the probe's SACK: %d data frames in %d; want data[2800:4200]", fr, len(got))
	}
	if r := retransmits(h); r[stats.TCPRetransTailProbe] != 1 || r[stats.TCPRetransSACK] != 1 || r[stats.TCPRetransTimeout] != 0 {
		t.Fatalf("retransmissions %v, want one tail probe and one SACK recovery", r)
	}
}

// TestTCPSACKedFINStartsRecovery: the guest lost the last two data frames
// but got our FIN, out of order, and SACKs it as Linux does (the block's
// end counts the FIN). It has everything after the hole, and nothing more
// can be sent: the hole goes at once, not after the ACK timeout. Comparing
// the SACK's edge with the data's end only, as first written, missed it,
// and the tail probe's SACK, inside that block, moved nothing (found by
// review).
func TestTCPSACKedFINStartsRecovery(t *testing.T) {
	h, _, peer, start, data := sackConn(t, Config{MTU: 1500, AckTimeout: time.Hour}, 4)
	end := start + uint32(len(data))
	h.peerCloses(peer)
	h.ack = start + 2800
	h.sendAck(nil)
	h.flush()
	h.sendSACK([2]uint32{end, end + 1})
	got := h.flush()
	if fr, n := dataFrames(got); fr != 2 || got[0].seq != start+2800 || n != 2800 || !bytes.Equal(tcpPayloadOf(got), data[2800:]) {
		t.Fatalf("after the SACK of the FIN: %d data frames, %d bytes; want data[2800:] at once", fr, n)
	}
	if r := retransmits(h); r[stats.TCPRetransSACK] != 1 || r[stats.TCPRetransTimeout] != 0 {
		t.Fatalf("retransmissions %v, want one SACK recovery", r)
	}
}

// peerCloses has the host peer close its side and pumps until our FIN to
// the guest went out.
func (h *tcpHarness) peerCloses(peer any) {
	h.t.Helper()
	if err := peer.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		h.t.Fatal(err)
	}
	h.collect("our FIN", func(s []tcpSeg) bool {
		return len(s) > 0 && s[len(s)-1].flags.Has(header.TCPFlagFIN)
	})
}

// TestTCPSACKAcrossSequenceWrap: SACK recovery works for a flight that
// crosses sequence number 0, and NewReno's fast retransmit after 2 GiB
// have been acknowledged since the last recovery. The highest SACKed
// sequence started at 0 and the recovery point stayed where the last
// rewind put it: for a flight around 0, or once the ACK was 2 GiB past
// them (4 GiB for the SACK high), they read as ahead of it, and duplicate
// ACKs that reported a loss were taken for echoes (recovery waited for
// the ACK timeout; found by review). Both now follow the ACK.
func TestTCPSACKAcrossSequenceWrap(t *testing.T) {
	for _, tc := range []struct {
		name  string
		iss   uint32
		sack  bool
		stale bool // recovery point and SACK high left 2 GiB behind
	}{
		// The flight ends past 0, its SACK blocks below: a SACK high of
		// 0 looked like more than any of them had.
		{"SACK, flight across 0", 0xffffffff - 12000, true, false},
		{"NewReno, 2 GiB on", 0x40000000, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tcpNewHarness(t, Config{MTU: 1500})
			h.tab.newISS = func() uint32 { return tc.iss }
			opts := tcpMss1400ws7
			if tc.sack {
				opts = tcpMss1400ws7SACK
			}
			peer := h.establish(h.listen(), opts)
			f := h.flow()
			start := f.seqToGuest
			got, data := h.tcpSendWindow(peer, 10)
			if got[0].seq != start {
				t.Fatalf("flight starts at %d", got[0].seq-start)
			}
			if tc.stale {
				// Where a recovery 2 GiB ago left them: just under 2^31
				// behind the guest's next ACK, and 2^31 behind the one
				// after.
				old := start + 1400 - (1 << 31) + 700
				f.recover, f.sackHigh = old, old
			}
			h.ack = start + 1400
			h.sendAck(nil) // frame 0
			h.ack = start + 2800
			h.sendAck(nil) // frame 1; frame 2 lost
			h.flush()
			var resent []tcpSeg
			for i := 3; i < 6 && len(resent) == 0; i++ {
				if tc.sack {
					h.wnd += 100
					h.sendSACK([2]uint32{start + 4200, start + uint32(1400*(i+1))})
				} else {
					h.sendAck(nil)
				}
				for _, s := range h.flush() {
					if len(s.payload) > 0 {
						resent = append(resent, s)
					}
				}
			}
			if len(resent) == 0 || resent[0].seq != start+2800 || !bytes.Equal(resent[0].payload, data[2800:4200]) {
				t.Fatalf("after three duplicate ACKs: resent %s, want frame 2 (data[2800:4200])", segsString(resent))
			}
			// Everything acknowledged: neither mark is left behind the
			// ACK, where 2 GiB (4 GiB) on it would read as ahead again.
			h.ack = start + uint32(len(data))
			h.sendAck(nil)
			h.flush()
			if seqLT(f.sackHigh, h.ack) || seqLT(f.recover+1, h.ack) {
				t.Fatalf("after the ACK of everything (%d): SACK high %d, recovery point %d behind it",
					h.ack-start, f.sackHigh-start, f.recover-start)
			}
		})
	}
}

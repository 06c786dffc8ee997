package tcp

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"vunet/tcpstack/header"
)

// TestTCPDelayedAck: the ACK for guest data waits up to DelayedAck for a
// frame to carry it, and goes at once where waiting would slow the guest.
func TestTCPDelayedAck(t *testing.T) {
	small := []byte("GET /x\r\n")
	full := bytes.Repeat([]byte{'s'}, 1400) // the guest's MSS (tcpMss1400ws7)
	pureAck := func(t *testing.T, ss []tcpSeg, want uint32) {
		t.Helper()
		if len(ss) != 1 || ss[0].flags != header.TCPFlagACK || len(ss[0].payload) != 0 || ss[0].ack != want {
			t.Fatalf("got %s, want one pure ACK of %d", segsString(ss), want)
		}
	}
	// expire runs the delayed-ACK timer and wants the ACK it sends.
	expire := func(t *testing.T, h *tcpHarness) {
		t.Helper()
		h.now = h.now.Add(defaultDelayedAck)
		h.tab.Timers(h.now)
		pureAck(t, h.flush(), h.seq)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		run  func(t *testing.T, h *tcpHarness, peer *net.TCPConn)
	}{
		{"the answer carries the ACK", Config{}, func(t *testing.T, h *tcpHarness, peer *net.TCPConn) {
			h.sendAck(small)
			if ss := h.flush(); len(ss) != 0 {
				t.Fatalf("sent %s before the answer", segsString(ss))
			}
			if got := tcpReadN(t, peer, len(small)); !bytes.Equal(got, small) {
				t.Fatalf("peer got %q", got)
			}
			peer.Write([]byte("200 OK"))
			ss := h.collect("the answer", func(ss []tcpSeg) bool { return len(tcpPayloadOf(ss)) == len("200 OK") })
			if len(ss) != 1 || ss[0].ack != h.seq || string(ss[0].payload) != "200 OK" {
				t.Fatalf("got %s, want the answer alone, acknowledging the request", segsString(ss))
			}
			// Nothing is left to send when the timer would have fired.
			h.now = h.now.Add(defaultDelayedAck)
			h.tab.Timers(h.now)
			if ss := h.flush(); len(ss) != 0 {
				t.Fatalf("after the answer: %s", segsString(ss))
			}
		}},
		{"no answer: the ACK goes when due", Config{}, func(t *testing.T, h *tcpHarness, _ *net.TCPConn) {
			h.sendAck(small)
			h.flush()
			if next := h.tab.NextTimer(); !next.Equal(h.now.Add(defaultDelayedAck)) {
				t.Fatalf("next timer in %v, want %v", next.Sub(h.now), defaultDelayedAck)
			}
			h.now = h.now.Add(defaultDelayedAck - time.Microsecond)
			h.tab.Timers(h.now)
			if ss := h.flush(); len(ss) != 0 {
				t.Fatalf("before the delay: %s", segsString(ss))
			}
			h.now = h.now.Add(time.Microsecond)
			h.tab.Timers(h.now)
			pureAck(t, h.flush(), h.seq)
		}},
		{"a guest that waited for the ACK: at once for a spell", Config{}, func(t *testing.T, h *tcpHarness, peer *net.TCPConn) {
			h.sendAck(small)
			h.flush()
			expire(t, h)
			// Nagle's second write, which waited for that ACK.
			h.sendAck(small)
			pureAck(t, h.flush(), h.seq)
			tcpReadN(t, peer, 2*len(small))
			peer.Write([]byte("200 OK"))
			h.collect("the answer", func(ss []tcpSeg) bool { return len(tcpPayloadOf(ss)) == len("200 OK") })
			h.sendAck(small)
			pureAck(t, h.flush(), h.seq)
		}},
		{"a guest that waited: at once for a spell, longer each time", Config{}, waitedSpells([]byte("200 OK"))},
		{"a spell counts exchanges, not frames", Config{}, waitedSpells(bytes.Repeat([]byte{'a'}, 3000))},
		{"a slow answer: delaying resumes", Config{}, func(t *testing.T, h *tcpHarness, peer *net.TCPConn) {
			h.sendAck(small)
			h.flush()
			expire(t, h)
			tcpReadN(t, peer, len(small))
			peer.Write([]byte("200 OK"))
			h.collect("the answer", func(ss []tcpSeg) bool { return len(tcpPayloadOf(ss)) == len("200 OK") })
			h.sendAck(small)
			if ss := h.flush(); len(ss) != 0 {
				t.Fatalf("the next request's ACK: %s, want it held", segsString(ss))
			}
		}},
		{"a request that acknowledges host data: held", Config{}, func(t *testing.T, h *tcpHarness, peer *net.TCPConn) {
			peer.Write([]byte("hello"))
			ss := h.collect("host data", func(ss []tcpSeg) bool { return len(tcpPayloadOf(ss)) == len("hello") })
			h.ack = ss[len(ss)-1].seq + uint32(len(ss[len(ss)-1].payload))
			h.sendAck(small)
			if ss := h.flush(); len(ss) != 0 {
				t.Fatalf("sent %s", segsString(ss))
			}
		}},
		{"the retransmission duplicate ACKs asked for: at once", Config{}, func(t *testing.T, h *tcpHarness, _ *net.TCPConn) {
			base := h.seq
			h.inject(h.frame(header.TCPFlagACK, base+uint32(len(small)), h.ack, h.wnd, nil, small))
			if ss := h.flush(); len(ss) == 0 || ss[0].ack != base {
				t.Fatalf("after a gap: %s, want duplicate ACKs of %d", segsString(ss), base)
			}
			h.inject(h.frame(header.TCPFlagACK, base, h.ack, h.wnd, nil, small))
			pureAck(t, h.flush(), base+uint32(len(small)))
		}},
		{"a remote peer's ACKs: not delayed", Config{AckOnPeerAck: true}, func(t *testing.T, h *tcpHarness, _ *net.TCPConn) {
			before := h.seq
			h.sendAck(small)
			ss := h.flush()
			if len(ss) != 1 || len(ss[0].payload) != 0 || seqLT(ss[0].ack, before) || seqGT(ss[0].ack, h.seq) {
				t.Fatalf("got %s, want one pure ACK at once", segsString(ss))
			}
			if !h.flow().delAckAt.IsZero() {
				t.Fatal("a delayed ACK is pending")
			}
		}},
		{"a guest ACK does not send it early", Config{}, func(t *testing.T, h *tcpHarness, _ *net.TCPConn) {
			h.sendAck(small)
			h.sendAck(nil)
			if ss := h.flush(); len(ss) != 0 {
				t.Fatalf("sent %s", segsString(ss))
			}
		}},
		{"the second full segment: at once", Config{}, func(t *testing.T, h *tcpHarness, _ *net.TCPConn) {
			h.sendAck(full)
			if ss := h.flush(); len(ss) != 0 {
				t.Fatalf("after one segment: %s", segsString(ss))
			}
			h.sendAck(full)
			pureAck(t, h.flush(), h.seq)
		}},
		{"half the window used: at once", Config{}, func(t *testing.T, h *tcpHarness, _ *net.TCPConn) {
			h.flow().wndSent = 2 * uint32(len(small)) // as a nearly full send buffer would leave it
			h.sendAck(small)
			pureAck(t, h.flush(), h.seq)
		}},
		{"a FIN: our FIN carries its ACK", Config{}, func(t *testing.T, h *tcpHarness, peer *net.TCPConn) {
			h.sendAck(small)
			h.flush()
			h.sendFin()
			if ss := h.flush(); len(ss) != 0 {
				t.Fatalf("sent %s before the peer closed", segsString(ss))
			}
			peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			if b, err := io.ReadAll(peer); err != nil || !bytes.Equal(b, small) {
				t.Fatalf("peer read %q, %v; want the request, then EOF", b, err)
			}
			peer.Close()
			ss := h.collect("our FIN", func(ss []tcpSeg) bool { return hasFlag(ss, header.TCPFlagFIN) })
			if len(ss) != 1 || ss[0].flags != header.TCPFlagFIN|header.TCPFlagACK || ss[0].ack != h.seq {
				t.Fatalf("got %s, want one FIN acknowledging the guest's (%d)", segsString(ss), h.seq)
			}
			h.now = h.now.Add(defaultDelayedAck)
			h.tab.Timers(h.now)
			if ss := h.flush(); len(ss) != 0 {
				t.Fatalf("after our FIN: %s", segsString(ss))
			}
		}},
		{"a FIN the peer does not answer: the ACK goes when due", Config{}, func(t *testing.T, h *tcpHarness, _ *net.TCPConn) {
			h.sendFin()
			if ss := h.flush(); len(ss) != 0 {
				t.Fatalf("sent %s at once", segsString(ss))
			}
			if next := h.tab.NextTimer(); !next.Equal(h.now.Add(defaultDelayedAck)) {
				t.Fatalf("next timer in %v, want %v", next.Sub(h.now), defaultDelayedAck)
			}
			expire(t, h)
		}},
		{"a FIN answering ours: at once", Config{}, func(t *testing.T, h *tcpHarness, peer *net.TCPConn) {
			peer.Close()
			ss := h.collect("our FIN", func(ss []tcpSeg) bool { return hasFlag(ss, header.TCPFlagFIN) })
			h.ack = ss[len(ss)-1].seq + 1
			h.sendFin()
			pureAck(t, h.flush(), h.seq)
		}},
		{"a FIN to a remote peer: at once", Config{AckOnPeerAck: true}, func(t *testing.T, h *tcpHarness, _ *net.TCPConn) {
			h.sendFin()
			pureAck(t, h.flush(), h.seq)
		}},
		{"DelayedAck < 0: at once", Config{DelayedAck: -1}, func(t *testing.T, h *tcpHarness, _ *net.TCPConn) {
			h.sendAck(small)
			pureAck(t, h.flush(), h.seq)
		}},
		{"a hand-over sends it at once", Config{}, func(t *testing.T, h *tcpHarness, _ *net.TCPConn) {
			h.sendAck(small)
			h.flush()
			h2 := h.handOver(Config{})
			pureAck(t, h2.flush(), h.seq)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tcpNewHarness(t, tc.cfg)
			peer := h.establish(h.listen(), tcpMss1400ws7)
			h.flush()
			tc.run(t, h, peer)
		})
	}
}

// segsString lists segments by flags, sequence, ACK and payload length.
func segsString(ss []tcpSeg) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d segments", len(ss))
	for _, s := range ss {
		fmt.Fprintf(&b, " [%v seq %d ack %d len %d]", s.flags, s.seq, s.ack, len(s.payload))
	}
	return b.String()
}

// TestTCPHeldFinAckSimultaneousClose: both sides close at once, and our FIN
// must go again (its retransmission timer fired with no RX buffer free)
// when the guest's FIN crosses it. The guest's FIN is answered without
// delay, since our FIN went first, and the ACK is sent even when the
// guest's ACK of our original FIN comes in the same pass and ends the
// connection: it was dropped with the ACK still held.
func TestTCPHeldFinAckSimultaneousClose(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	peer := h.establish(h.listen(), tcpMss1400ws7)
	h.flush()
	peer.Close()
	ss := h.collect("our FIN", func(ss []tcpSeg) bool { return hasFlag(ss, header.TCPFlagFIN) })
	ourFin := ss[len(ss)-1].seq
	f := h.flow()
	h.w.free = 0 // the retransmission finds no buffer
	h.now = h.now.Add(h.tab.ackTimeout(f))
	h.tab.Timers(h.now)
	h.flush()
	h.batch = true
	h.sendFin() // crossing ours: it does not acknowledge it
	h.ack = ourFin + 1
	h.sendAck(nil) // the guest's ACK of our FIN, in the same TX batch
	h.flushSends()
	h.batch = false
	h.w.free = 100
	got := h.flush()
	acked := false
	for _, s := range got {
		acked = acked || (s.flags.Has(header.TCPFlagACK) && s.ack == h.seq)
	}
	if !acked {
		t.Fatalf("got %s: the guest's FIN (%d) was never acknowledged", segsString(got), h.seq)
	}
}

// TestTCPProbeDoesNotCarryHeldAck: a zero-window probe is one below the
// guest's window, and the guest drops it before it reads the ACK field: an
// ACK held for a frame to carry it (here the guest's FIN's) goes in a
// frame of its own first, not only on the probe.
func TestTCPProbeDoesNotCarryHeldAck(t *testing.T) {
	h := tcpNewHarness(t, Config{AckTimeout: time.Second})
	peer := h.establish(h.listen(), tcpMss1400ws7)
	f := h.flow()
	h.flush()
	h.wnd = 0 // the guest shuts its window
	h.sendAck(nil)
	h.flush()
	peer.Write(make([]byte, 3000))
	h.waitQueued(3000)
	h.pump(10 * time.Millisecond)
	h.sendFin()
	if got := h.flush(); len(got) != 0 {
		t.Fatalf("the FIN's ACK went at once: %s", segsString(got))
	}
	f.flags |= flProbeDue // the probe timer, before the delayed ACK's
	h.tab.markDirty(f)
	got := h.flush()
	var probe, ack bool
	for _, s := range got {
		probe = probe || s.seq == f.seqToGuest-1
		ack = ack || (s.seq == f.seqToGuest && s.ack == h.seq)
	}
	if !probe || !ack {
		t.Fatalf("got %s: want the probe and, in a frame of its own, the ACK of the guest's FIN (%d)", segsString(got), h.seq)
	}
}

// waitedSpells is TestTCPDelayedAck's case of a guest found waiting for a
// delayed ACK again and again: a header the peer does not answer, then
// requests (the QEMU bench's RR client), with answer as every answer. ACKs
// go at once for spells of 2, 4 and 8 exchanges, however many frames an
// answer takes, and wait for the answer after each spell.
func waitedSpells(answer []byte) func(t *testing.T, h *tcpHarness, peer *net.TCPConn) {
	return func(t *testing.T, h *tcpHarness, peer *net.TCPConn) {
		small := []byte("GET /x\r\n")
		sent := 0
		exchange := func(wantAckAtOnce bool) {
			t.Helper()
			h.sendAck(small)
			ss := h.flush()
			if wantAckAtOnce {
				if len(ss) != 1 || ss[0].flags != header.TCPFlagACK || len(ss[0].payload) != 0 || ss[0].ack != h.seq {
					t.Fatalf("request %d: %s, want one pure ACK of %d", sent, segsString(ss), h.seq)
				}
			} else if len(ss) != 0 {
				t.Fatalf("request %d: %s, want its ACK held for the answer", sent, segsString(ss))
			}
			sent++
			tcpReadN(t, peer, len(small))
			peer.Write(answer)
			ss = h.collect("the answer", func(ss []tcpSeg) bool { return len(tcpPayloadOf(ss)) == len(answer) })
			if last := ss[len(ss)-1]; last.ack != h.seq {
				t.Fatalf("answer %d acknowledges %d, want %d", sent, last.ack, h.seq)
			}
			if data := len(ss) - countPure(ss); len(answer) > 1400 && data < 2 {
				t.Fatalf("answer %d (%d bytes) in %d frame(s): the case needs answers of several", sent, len(answer), data)
			}
			h.ack += uint32(len(answer))
		}
		for spell := delAckSpellMin; spell <= 4*delAckSpellMin; spell *= 2 {
			h.sendAck(small) // unanswered
			h.flush()
			h.now = h.now.Add(defaultDelayedAck)
			h.tab.Timers(h.now)
			if ss := h.flush(); len(ss) != 1 || len(ss[0].payload) != 0 || ss[0].ack != h.seq {
				t.Fatalf("the header's delayed ACK: %s", segsString(ss))
			}
			tcpReadN(t, peer, len(small))
			// The first request comes before any answer: the guest
			// waited. ACKs go at once for the spell's exchanges...
			for range spell {
				exchange(true)
			}
			// ...then wait for the answer again.
			exchange(false)
			exchange(false)
		}
	}
}

// countPure counts the frames without payload.
func countPure(ss []tcpSeg) int {
	n := 0
	for _, s := range ss {
		if len(s.payload) == 0 {
			n++
		}
	}
	return n
}

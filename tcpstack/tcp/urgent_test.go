package tcp

import (
	"fmt"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
)

// TestTCPUrgentDataInline: a host peer's urgent byte (MSG_OOB) reaches the
// guest in its place in the stream, and nothing after it is lost or
// repeated: the guest has no way to take it out of band, and a byte taken
// out of the stream moves the peek offset off the data (found by review:
// "abc", "hello", then a stray "o").
func TestTCPUrgentDataInline(t *testing.T) {
	h := urgentConn(t)
	want := "abcxhello"
	// Pumped for up to 4 bytes more than expected: a repeated byte shows.
	got := h.pumpAcking(len(want)+4, time.Second)
	if string(got) != want {
		t.Fatalf("guest got %q, want %q", got, want)
	}
}

// TestTCPUrgentDataCumulativeAck: one guest ACK for data on both sides of
// an urgent mark consumes all of it: a read stops at the mark, and a
// short consume read as a failure reset the connection (found by review).
func TestTCPUrgentDataCumulativeAck(t *testing.T) {
	h := urgentConn(t)
	var got []byte
	var last tcpSeg
	// No ACK from the guest meanwhile: "xhello" comes with its EPOLLIN.
	for deadline := time.Now().Add(2 * time.Second); len(got) < 9 && time.Now().Before(deadline); {
		segs := h.pump(50 * time.Millisecond)
		got = append(got, tcpPayloadOf(segs)...)
		if len(segs) > 0 {
			last = segs[len(segs)-1]
		}
	}
	if string(got) != "abcxhello" {
		t.Fatalf("guest got %q", got)
	}
	h.ack = last.seq + uint32(len(last.payload))
	h.sendAck(nil)
	h.flush()
	f := h.flow()
	if f == nil || f.state != stats.TCPEstablished || f.inFlight() != 0 {
		t.Fatalf("after one ACK for all of it: flow %v", f)
	}
	if n := sumReasons(&h.stats.Resets); n != 0 {
		t.Fatalf("%d resets", n)
	}
}

// urgentConn is an established connection whose host peer sent "abc",
// then "x" as urgent data (MSG_OOB), then "hello", each its own segment.
func urgentConn(t *testing.T) *tcpHarness {
	t.Helper()
	h := tcpNewHarness(t, Config{MTU: 1500})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	sendUrgent(t, peer)
	return h
}

// sendUrgent has peer send "abc", "x" as urgent data, and "hello".
func sendUrgent(t *testing.T, peer *net.TCPConn) {
	t.Helper()
	raw, err := peer.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		b     string
		flags int
	}{{"abc", 0}, {"x", unix.MSG_OOB}, {"hello", 0}} {
		var serr error
		raw.Write(func(fd uintptr) bool { serr = unix.Sendto(int(fd), []byte(s.b), s.flags, nil); return true })
		if serr != nil {
			t.Fatal(serr)
		}
		time.Sleep(20 * time.Millisecond) // separate segments
	}
}

// TestTCPUrgentDataAfterMigration: a connection imported the way a
// migration destination imports (detached, attached later) watches for
// urgent data as one opened here does. The exporter's epoll mask does not
// carry EPOLLPRI, and registering that mask left a read stopped at the
// urgent mark marked drained: "xhello" waited for the peer's next segment
// (found by review).
func TestTCPUrgentDataAfterMigration(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	h.flush()
	h = h.handOverTo(Config{MTU: 1500}, true)
	h.flush()
	sendUrgent(t, peer)
	want := "abcxhello"
	if got := h.pumpAcking(len(want), 2*time.Second); string(got) != want {
		t.Fatalf("guest got %q after the migration, want %q", got, want)
	}
}

// pumpAcking pumps until n payload bytes reached the guest or d passed,
// the guest acknowledging each pass's frames, and returns them.
func (h *tcpHarness) pumpAcking(n int, d time.Duration) []byte {
	h.t.Helper()
	var got []byte
	for deadline := time.Now().Add(d); len(got) < n && time.Now().Before(deadline); {
		segs := h.pump(50 * time.Millisecond)
		got = append(got, tcpPayloadOf(segs)...)
		if len(segs) > 0 {
			last := segs[len(segs)-1]
			h.ack = last.seq + uint32(len(last.payload))
			h.sendAck(nil)
		}
	}
	return got
}

// TestTCPUrgentDataRewound: the guest loses everything sent across an
// urgent mark and the ACK timeout resends from the start. The resend's
// read stops at the mark again, but what was sent before is still in the
// socket: the rest follows at once. Before, the short read counted as
// "socket empty" and the connection waited for host data that never came
// (found by review: "abc" resent, then nothing until the idle timeout).
func TestTCPUrgentDataRewound(t *testing.T) {
	for _, noPeekOff := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoPeekOffset=%v", noPeekOff), func(t *testing.T) {
			h := tcpNewHarness(t, Config{MTU: 1500, NoPeekOffset: noPeekOff})
			peer := h.establish(h.listen(), tcpMss1400ws7)
			sendUrgent(t, peer)
			// Without SO_PEEK_OFF, reads start at the socket's head and the
			// mark stops them after "abc" until the guest acknowledges it.
			want := "abcxhello"
			if noPeekOff {
				want = "abc"
			}
			var got []byte
			for deadline := time.Now().Add(2 * time.Second); len(got) < len(want) && time.Now().Before(deadline); {
				got = append(got, tcpPayloadOf(h.pump(50*time.Millisecond))...)
			}
			if string(got) != want {
				t.Fatalf("guest got %q before the loss, want %q", got, want)
			}
			h.now = h.now.Add(3 * time.Second) // all of it lost: the ACK timeout
			h.tab.Timers(h.now)
			re := tcpPayloadOf(h.flush())
			h.ack += uint32(len(re))
			h.sendAck(nil)
			re = append(re, h.pumpAcking(9, time.Second)...)
			if string(re) != "abcxhello" {
				t.Fatalf("after the ACK timeout the guest got %q, want %q again", re, "abcxhello")
			}
		})
	}
}

// TestTCPUrgentDataThenPeerClose: the peer sends data with an urgent byte
// in it and closes. Our FIN follows every byte: without SO_PEEK_OFF a read
// from the start of the socket stops at the mark, which looked like the end
// of the stream once the peer's FIN was seen (found by review: "abc" and
// FIN, "xhello" lost).
func TestTCPUrgentDataThenPeerClose(t *testing.T) {
	for _, noPeekOff := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoPeekOffset=%v", noPeekOff), func(t *testing.T) {
			h := urgentThenClose(t, noPeekOff)
			var got []byte
			fin := false
			for deadline := time.Now().Add(3 * time.Second); !fin && time.Now().Before(deadline); {
				segs := h.pump(50 * time.Millisecond)
				for _, s := range segs {
					got = append(got, s.payload...)
					if s.flags.Has(header.TCPFlagFIN) {
						fin = true
						if string(got) != "abcxhello" {
							t.Fatalf("our FIN after %q, want after %q", got, "abcxhello")
						}
					}
				}
				if len(segs) > 0 {
					last := segs[len(segs)-1]
					h.ack = last.seq + uint32(len(last.payload))
					h.sendAck(nil)
				}
			}
			if !fin || string(got) != "abcxhello" {
				t.Fatalf("guest got %q, FIN %v; want %q and our FIN", got, fin, "abcxhello")
			}
		})
	}
}

// urgentThenClose establishes a connection whose host peer then sends
// "abc", the urgent byte "x" and "hello" (sendUrgent), and closes.
func urgentThenClose(t *testing.T, noPeekOff bool) *tcpHarness {
	t.Helper()
	h := tcpNewHarness(t, Config{MTU: 1500, NoPeekOffset: noPeekOff})
	peer := h.establish(h.listen(), tcpMss1400ws7)
	sendUrgent(t, peer)
	peer.CloseWrite()
	time.Sleep(20 * time.Millisecond)
	return h
}

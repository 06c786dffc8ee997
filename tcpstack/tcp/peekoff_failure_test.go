package tcp

import (
	"testing"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// TestTCPPeekOffsetFailureResets: a socket whose SO_PEEK_OFF cannot be set
// back after a resend (the hole's offset) or by a rewind (offset 0) would
// be read at the wrong offset next, and the guest would get other bytes at
// their sequence. The connection is reset instead: an RST to the guest,
// counted as an error, and no data frame after the failure.
func TestTCPPeekOffsetFailureResets(t *testing.T) {
	if !hostsock.PeekOffsetSupported(false) {
		t.Skip("kernel without SO_PEEK_OFF for TCP: the discard fallback has no offset to restore")
	}
	for _, tc := range []struct {
		name string
		fail func(off int, f *conn) bool // which setsockopt fails
		lose func(h *tcpHarness, start uint32) []tcpSeg
	}{
		{"restore after a SACK resend", func(off int, f *conn) bool { return off == int(f.inFlight()) }, func(h *tcpHarness, start uint32) (got []tcpSeg) {
			h.ack = start + 2800
			h.sendAck(nil)
			h.flush()
			for i := 3; i < 6; i++ { // three ACKs that SACK more: the hole goes
				h.wnd += 100
				h.sendSACK([2]uint32{start + 4200, start + uint32(1400*(i+1))})
				got = append(got, h.flush()...)
			}
			return got
		}},
		{"restore after a tail probe", func(off int, f *conn) bool { return off == int(f.inFlight()) }, func(h *tcpHarness, start uint32) []tcpSeg {
			h.ack = start + 2800
			h.sendAck(nil) // an RTT sample: the probe timer can be set
			h.flush()
			h.now = h.now.Add(h.tab.pto(h.flow()))
			h.tab.Timers(h.now)
			return h.flush()
		}},
		{"rewind on a timeout", func(off int, f *conn) bool { return off == 0 }, func(h *tcpHarness, start uint32) []tcpSeg {
			h.now = h.now.Add(h.tab.ackTimeout(h.flow()))
			h.tab.Timers(h.now)
			return h.flush()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, f, _, start, _ := sackConn(t, Config{MTU: 1500}, 10)
			if !f.peekOff {
				t.Fatal("connection does not read at SO_PEEK_OFF")
			}
			failed := 0
			h.tab.setPeekOff = func(fd, off int) error {
				if tc.fail(off, f) {
					failed++
					return unix.ENOMEM
				}
				return hostsock.SetPeekOffset(fd, off)
			}
			got := tc.lose(h, start)
			if failed == 0 {
				t.Fatal("the failing setsockopt was never made: the test does not reach the path")
			}
			var rst bool
			for _, s := range got {
				if rst && len(s.payload) > 0 {
					t.Fatalf("%d bytes of data at %d after the RST", len(s.payload), s.seq-start)
				}
				rst = rst || s.flags.Has(header.TCPFlagRST)
			}
			if !rst {
				frames, bytes := dataFrames(got)
				t.Fatalf("no RST to the guest after the failed SO_PEEK_OFF (%d frames, %d data frames of %d bytes)", len(got), frames, bytes)
			}
			if n := h.stats.Resets[stats.TCPError].Load(); n != 1 {
				t.Fatalf("%d resets counted as errors, want 1", n)
			}
			if n := h.stats.Retransmits[stats.TCPRetransTailProbe].Load(); n != 0 {
				t.Fatalf("%d tail probes counted, but none went out", n)
			}
			if len(got) > 0 && !got[0].flags.Has(header.TCPFlagRST) {
				t.Fatalf("a %v frame went before the RST", got[0].flags)
			}
			if h.flow() != nil {
				t.Fatalf("connection still in the table")
			}
		})
	}
}

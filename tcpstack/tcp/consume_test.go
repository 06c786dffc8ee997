package tcp

import (
	"bytes"
	"testing"

	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
)

// TestTCPConsumeOncePerBatch: the guest's ACKs in one TX batch consume
// what they acknowledged with one receive at the batch's end, not one per
// ACK; the ACK number moves at once, and a rewind in the same batch (two
// duplicate ACKs after the ACK that moved) sends again exactly the bytes
// after it, as the socket's queue and peek offset say once consumed. With
// SO_PEEK_OFF and with the discard-buffer fallback.
func TestTCPConsumeOncePerBatch(t *testing.T) {
	for _, tc := range []struct {
		name      string
		noPeekOff bool
	}{{"peek offset", false}, {"discard buffer", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h := tcpNewHarness(t, Config{MTU: 1500, NoPeekOffset: tc.noPeekOff})
			peer := h.establish(h.listen(), tcpMss1400ws7)
			f := h.flow()
			start := f.seqToGuest
			data := guestframe.Pattern(3000)
			peer.Write(data)
			h.waitQueued(len(data))
			if got := h.pumpPayload(len(data), 5e9); !bytes.Equal(got, data) {
				t.Fatalf("guest got %d bytes, want the 3000 written", len(got))
			}

			h.batch = true
			before := h.tab.consumes
			for _, ack := range []uint32{1000, 1500, 2000, 2000, 2000} {
				h.ack = start + ack
				h.sendAck(nil)
			}
			if f.seqAckFromGuest != start+2000 {
				t.Fatalf("ACK from the guest %d, want 2000", f.seqAckFromGuest-start)
			}
			if q := h.queued(); q != 3000 {
				t.Fatalf("socket holds %d bytes inside the batch, want all 3000 (consumed at its end)", q)
			}
			h.flushSends()
			if q := h.queued(); q != 1000 {
				t.Fatalf("socket holds %d bytes after the batch, want the 1000 not acknowledged", q)
			}
			if n := h.tab.consumes - before; n != 1 {
				t.Fatalf("%d receives consumed the batch's three ACKs, want 1", n)
			}
			if h.stats.Retransmits[stats.TCPRetransDupAck].Load() != 1 {
				t.Fatalf("dup-ack retransmits %d, want 1", h.stats.Retransmits[stats.TCPRetransDupAck].Load())
			}
			re := h.flush()
			if len(re) == 0 || re[0].seq != start+2000 || !bytes.Equal(tcpPayloadOf(re), data[2000:]) {
				t.Fatalf("resent from %d, %d bytes; want the 1000 after 2000", re[0].seq-start, len(tcpPayloadOf(re)))
			}
		})
	}
}

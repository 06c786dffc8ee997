package tcp

import (
	"testing"
	"time"

	"vunet/tcpstack/header"
)

// TestTCPChallengeAcksRateLimited: a guest that keeps sending what RFC 5961
// answers with a challenge ACK (RSTs in the window but not at the next
// byte, SYNs on the established connection, ACKs of data never sent) gets
// one per connection per 500 ms, not one per segment (main answered each of
// the 3×50 segments below: 150 ACKs), and the connection is untouched.
func TestTCPChallengeAcksRateLimited(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	f := h.flow()
	h.flush()
	kinds := []struct {
		name string
		seg  func() []byte
	}{
		{"in-window RST", func() []byte { return h.frame(header.TCPFlagRST, h.seq+1000, 0, 0, nil, nil) }},
		{"SYN", func() []byte { return h.frame(header.TCPFlagSYN, h.seq+7, 0, h.wnd, nil, nil) }},
		{"ACK of unsent data", func() []byte { return h.frame(header.TCPFlagACK, h.seq, h.ack+100000, h.wnd, nil, nil) }},
	}
	acks := 0
	for _, k := range kinds {
		for i := 0; i < 50; i++ {
			// One output pass per segment: coalescing within a pass is
			// not the limit under test.
			h.inject(k.seg())
			for _, s := range h.flush() {
				if s.flags != header.TCPFlagACK || s.ack != h.seq {
					t.Fatalf("%s: answered %+v, want a challenge ACK at %d", k.name, s, h.seq-h.isn)
				}
				acks++
			}
			h.now = h.now.Add(time.Millisecond)
		}
	}
	// 150 segments over 150 ms: the first gets its challenge ACK, the
	// rest fall within 500 ms of it.
	if acks != 1 || h.stats.ChallengeAcksLimited.Load() != 149 {
		t.Fatalf("%d challenge ACKs for 150 segments in 150 ms (%d limited), want 1", acks, h.stats.ChallengeAcksLimited.Load())
	}
	h.now = h.now.Add(challengeAckInterval)
	h.inject(kinds[0].seg())
	if got := h.flush(); len(got) != 1 || got[0].flags != header.TCPFlagACK {
		t.Fatalf("after 500 ms: %+v, want one challenge ACK", got)
	}
	if h.flow() != f {
		t.Fatalf("the connection did not survive")
	}
	h.sendAck([]byte("ping"))
	h.flush()
	if b := tcpReadN(t, peer, 4); string(b) != "ping" {
		t.Fatalf("peer got %q", b)
	}
}

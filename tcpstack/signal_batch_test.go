package tcpstack

import (
	"bytes"
	"testing"
	"time"
)

// The loop defers its interrupts to the end of each iteration
// (virtqueue.SignalPending) and sends them before it sleeps: a guest that
// sends an ARP request gets the TX completion's interrupt and the reply's,
// each ring's call eventfd signalled, with no further event to push them
// out. Without EVENT_IDX every publication asks for one; with it the
// driver asks for the next one each time, as Linux does when it re-enables
// callbacks.
func TestLoopSignalsBothRingsBeforeSleeping(t *testing.T) {
	for _, tc := range []struct {
		name     string
		features uint64
	}{{"legacy", featLegacy}, {"event idx", featModern}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPair(t, tc.features, 64)
			p.postRX(8, 2048)
			p.start()
			var rxCalls, txCalls uint64
			for i := 1; i <= 5; i++ {
				p.rx.SetUsedEvent(uint16(i - 1))
				p.tx.SetUsedEvent(uint16(i - 1))
				p.addTX(arpRequest(testGuestIP, testGwIP))
				p.tx.Send()
				waitFor(t, "both interrupts", 5*time.Second, func() bool {
					rxCalls += p.rx.Calls()
					txCalls += p.tx.Calls()
					return rxCalls >= uint64(i) && txCalls >= uint64(i)
				})
				if got := p.rx.UsedIdx(); got != uint16(i) {
					t.Fatalf("request %d: RX used index %d, want %d", i, got, i)
				}
			}
			_, frames := p.rxRead(t)
			want := arpReplyFor(testGuestIP, testGwIP)
			if len(frames) != 5 || !bytes.Equal(frames[4], want) {
				t.Fatalf("%d replies, last %x; want 5 of %x", len(frames), frames[len(frames)-1], want)
			}
		})
	}
}

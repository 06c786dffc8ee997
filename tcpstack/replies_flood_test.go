package tcpstack

import (
	"bytes"
	"testing"
	"time"

	"vunet/tcpstack/stats"
)

// TestRepliesOfAFullTXBatch: one TX batch of requests asks for more
// replies than the pending ring holds (a guest flooding ARP); with RX
// buffers posted every request is answered, none dropped from the ring.
func TestRepliesOfAFullTXBatch(t *testing.T) {
	p := newTestPair(t, featModern, 256)
	const n = txBatchMax // > pendingReplies
	for range n {
		p.rx.AddBuffers(nil, 128)
	}
	p.rx.Post()
	p.start()
	for i := range n {
		p.addTX(arpRequest(testGuestIP, [4]byte{10, 0, 3, byte(i)}))
	}
	p.tx.Send()
	st := p.stats()
	waitFor(t, "TX consumed", 2*time.Second, func() bool { return p.tx.UsedIdx() == n })
	waitFor(t, "replies", 2*time.Second, func() bool { return p.rx.UsedIdx() == n })
	if d := st.RX.Drops[stats.DropPendingOverflow].Load(); d != 0 {
		t.Fatalf("%d replies dropped from the pending ring with %d RX buffers posted", d, n)
	}
	_, frames := p.rxRead(t)
	for i, f := range frames {
		if want := arpReplyFor(testGuestIP, [4]byte{10, 0, 3, byte(i)}); !bytes.Equal(f, want) {
			t.Fatalf("reply %d\n got %x\nwant %x", i, f, want)
		}
	}
}

// TestUnansweredLinkFramesCounted: frames for a link service that ask
// nothing it answers (an ARP probe, an ARP announcement) are counted as
// dropped, like every frame the data path does not translate.
func TestUnansweredLinkFramesCounted(t *testing.T) {
	p := newTestPair(t, featModern, 64)
	p.start()
	p.addTX(arpRequest([4]byte{}, testGuestIP))   // a duplicate-address probe
	p.addTX(arpRequest(testGuestIP, testGuestIP)) // an announcement
	p.tx.Send()
	st := p.stats()
	waitFor(t, "TX consumed", 2*time.Second, func() bool { return p.tx.UsedIdx() == 2 })
	waitFor(t, "drops counted", 2*time.Second, func() bool { return st.TX.Drops[stats.DropUnanswered].Load() == 2 })
}

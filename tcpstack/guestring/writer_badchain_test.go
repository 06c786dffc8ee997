package guestring

import (
	"testing"

	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// A bad chain that Pop went past is the guest's again at the next Publish,
// even when nothing was written: used.idx moves by it alone (one batch),
// and the good chain popped behind it is given back for the next frame.
func TestPublishReturnsSkippedBadChain(t *testing.T) {
	ring, _ := newTestRing(t, featMrg, 8)
	ring.SetDesc(5, 1<<40, 1536, virtqueue.DescFlagWrite, 0) // outside guest memory
	ring.PutAvail(5)
	good := ring.AddBuffers(nil, 1536)
	ring.Post()
	st := new(stats.Queue)
	var w Writer
	w.Init(ring.Q, st, testLogger, featMrg, true)

	if _, _, s := w.Reserve(42, 1000); s != OK {
		t.Fatalf("Reserve: %v", s)
	}
	w.Abort()
	w.Publish()
	if got := ring.UsedIdx(); got != 1 {
		t.Fatalf("used.idx %d after Publish, want 1 (the bad chain)", got)
	}
	if u := ring.UsedElem(0); u.ID != 5 || u.Len != 0 {
		t.Fatalf("used[0] = id %d len %d, want the bad chain 5 with length 0", u.ID, u.Len)
	}
	if b := st.RX.Batches.Load(); b != 1 {
		t.Fatalf("RX batches %d, want 1", b)
	}
	// The good chain was given back, not lost: the next frame takes it.
	if _, _, s := w.Reserve(42, 1000); s != OK {
		t.Fatalf("second Reserve: %v", s)
	}
	w.Commit(100, nil)
	w.Publish()
	if got := ring.UsedIdx(); got != 2 {
		t.Fatalf("used.idx %d after the second Publish, want 2", got)
	}
	if u := ring.UsedElem(1); u.ID != uint32(good) {
		t.Fatalf("used[1] = id %d, want the good chain %d", u.ID, good)
	}
}

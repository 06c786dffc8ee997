package dgram

import (
	"slices"
	"testing"

	"vunet/tcpstack/stats"
)

// TestUDPReceiveSegmentedSends: a host peer on loopback that sends with
// UDP_SEGMENT (any QUIC stack) may put up to UDP_MAX_SEGMENTS (128 since
// Linux 6.9) datagrams in one send; with UDP_GRO on the flow's socket the
// receive hands them over as one. 16 such receives in one batch are 2048
// datagrams: each reaches the guest (with room for 64 a receive, 1024 were
// lost and one drop counted).
func TestUDPReceiveSegmentedSends(t *testing.T) {
	ft, i, c := flowTo(t)
	w := &ringSink{bufSize: 1536, mrg: true, free: 1 << 20}
	const seg, perSend, sends = 400, 128, 16
	var sizes []int
	// The flow's first datagram is received alone; a single one first.
	if _, err := c.Write(datagram(0, 10)); err != nil {
		t.Fatal(err)
	}
	sizes = append(sizes, 10)
	flushFlow(t, ft, i, w)
	for range sends {
		seq := len(sizes)
		if err := trySendSegmented(c, &seq, seg, slices.Repeat([]int{seg}, perSend)...); err != nil {
			t.Skip("this kernel refuses 128 segments a send (UDP_MAX_SEGMENTS is 64 before Linux 6.9):", err)
		}
		sizes = append(sizes, slices.Repeat([]int{seg}, perSend)...)
	}
	flushFlow(t, ft, i, w)
	drops := ft.st.Proto.UDPDrops[stats.ToGuest][stats.DropNoFit].Load()
	t.Logf("sent %d datagrams; guest got %d, drops counted %d, coalesced receives %d", len(sizes), len(w.frames), drops, ft.rx.coalesced)
	if uint64(len(w.frames))+drops != uint64(len(sizes)) {
		t.Errorf("%d datagrams delivered + %d counted dropped != %d received from the socket", len(w.frames), drops, len(sizes))
	}
	if len(w.frames) != len(sizes) {
		t.Errorf("guest got %d of %d datagrams", len(w.frames), len(sizes))
	}
}

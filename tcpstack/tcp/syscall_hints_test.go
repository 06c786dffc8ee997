package tcp

import (
	"bytes"
	"testing"
	"time"

	"vunet/tcpstack/internal/guestframe"
)

// TestTCPSyscallHints: a download's passes skip what cannot have changed,
// and lose nothing by it. A short read empties the socket: no second peek
// for EAGAIN behind it. After a read that emptied the socket, a guest ACK
// reads nothing (no peek for EAGAIN) and refreshes no window (no TCP_INFO,
// the guest sent no data); new host data is still read on its EPOLLIN, and
// guest data still refreshes the ACK and window.
func TestTCPSyscallHints(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	f := h.flow()

	first := guestframe.Pattern(3000)
	peer.Write(first)
	h.waitQueued(len(first))
	reads := h.tab.reads
	segs := h.pump(1000 * time.Millisecond)
	if got := tcpPayloadOf(segs); !bytes.Equal(got, first) {
		t.Fatalf("first read: %d bytes, want %d", len(got), len(first))
	}
	// 3000 bytes, well within the window: one read takes them all, and
	// coming up short says the socket is empty (no urgent data, no FIN
	// reported).
	if n := h.tab.reads - reads; n != 1 || !f.drained {
		t.Fatalf("%d peeks for data that fit in one, drained %v: want 1 and drained (no peek for EAGAIN)", n, f.drained)
	}
	last := segs[len(segs)-1]
	h.ack = last.seq + uint32(len(last.payload))
	h.sendAck(nil)
	h.flush()
	reads, infos := h.tab.reads, h.tab.infoReads
	for i := 0; i < 3; i++ {
		h.sendAck(nil)
		if more := h.flush(); len(tcpPayloadOf(more)) != 0 {
			t.Fatalf("data from an empty socket")
		}
	}
	if h.tab.reads != reads || h.tab.infoReads != infos {
		t.Fatalf("3 guest ACKs with nothing new: %d peeks and %d TCP_INFO reads, want 0 and 0",
			h.tab.reads-reads, h.tab.infoReads-infos)
	}

	// New host data: its EPOLLIN brings the read back.
	second := guestframe.Pattern(5000)[2000:]
	peer.Write(second)
	h.waitQueued(len(second))
	got := h.pumpPayload(len(second), 5*time.Second)
	if !bytes.Equal(got, second) {
		t.Fatalf("after new data: %d bytes, want %d", len(got), len(second))
	}
	if h.tab.reads == reads {
		t.Fatal("new data read without a peek")
	}

	// Guest data: written, acknowledged, and the window read again.
	infos = h.tab.infoReads
	up := []byte("guest data")
	h.ack += uint32(len(got))
	h.sendAck(up)
	acks := h.flush()
	if h.tab.infoReads == infos {
		t.Fatal("guest data did not refresh the ACK and window")
	}
	if len(acks) == 0 || acks[len(acks)-1].ack != h.seq {
		t.Fatalf("guest data not acknowledged: %d frames", len(acks))
	}
	buf := make([]byte, 64)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := peer.Read(buf); err != nil || !bytes.Equal(buf[:n], up) {
		t.Fatalf("peer read %q, %v", buf[:n], err)
	}
}

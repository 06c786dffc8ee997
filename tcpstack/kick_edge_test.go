package tcpstack

import (
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestKicksEdgeTriggered: the loop watches the kick eventfds
// edge-triggered and never reads them while it runs (a system call per
// wake-up saved), yet serves every kick, also one that comes while the
// counter is still up from earlier ones; when the pair stops, the counters
// are clear, so the front-end taking the rings back finds no kick that was
// already served.
func TestKicksEdgeTriggered(t *testing.T) {
	p := newTestPair(t, featModern, 64)
	p.postRX(8, 2048)
	p.start()
	for i := 1; i <= 3; i++ {
		p.addTX(arpRequest(testGuestIP, testGwIP))
		p.tx.Send()
		waitFor(t, "ARP reply", 2*time.Second, func() bool { return p.rx.UsedIdx() == uint16(i) })
	}
	if n := peekCounter(t, p.tx.Kick); n == 0 {
		t.Fatal("the loop read the TX kick counter while running")
	}
	// Kicks that come before the loop looks are one edge: counted once.
	if k := p.tx.Stats.Kicks.Load(); k == 0 {
		t.Fatal("no TX kick counted")
	}
	p.s.StopPair(p.qp.Index)
	for _, r := range []*testRing{p.tx, p.rx} {
		if n := peekCounter(t, r.Kick); n != 0 {
			t.Fatalf("kick counter %d after the pair stopped, want 0", n)
		}
	}
}

// peekCounter reads an eventfd's counter and puts it back.
func peekCounter(t *testing.T, fd int) uint64 {
	t.Helper()
	var b [8]byte
	n, err := unix.Read(fd, b[:])
	if err == unix.EAGAIN {
		return 0
	}
	if err != nil || n != 8 {
		t.Fatalf("read eventfd: %d %v", n, err)
	}
	v := binary.NativeEndian.Uint64(b[:])
	if _, err := unix.Write(fd, b[:]); err != nil {
		t.Fatal(err)
	}
	return v
}

package tcp

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/header"
)

// TestRingBudgetCapsWindows: without TSO a front-end's TX ring holds one
// segment per frame, and a front-end that forwards without back-pressure
// (testpmd) drops what it cannot hold. The window each connection is given
// must stay within its share of 7/16 of the ring (in MSS-sized segments),
// shared by the connections sending data, and the budget must lapse when a
// sender goes quiet. The send buffer is pinned large so that only the
// budget can hold the window down.
func TestRingBudgetCapsWindows(t *testing.T) {
	const ring, mss = 1024, 1460
	// Every segment is ACKed at once, so every send refreshes the window.
	h := tcpNewHarness(t, Config{MTU: 1500, SndBuf: 8 << 20, DelayedAck: -1})
	h.tab.SetTXRing(ring)
	opts := header.TCPOptions{HasMSS: true, MSS: mss, HasWindowScale: true, WindowScale: 7}
	ln := h.listen()
	peer := h.establish(ln, opts)
	go drain(peer)

	// A second connection from another guest port, sharing the table.
	h2 := *h
	h2.guest = netip.AddrPortFrom(h.guest.Addr(), h.guest.Port()+1)
	h2.isn = h.isn + 77777
	h2.sendSYN(opts)
	h2.collect("SYN-ACK of the second connection", func(segs []tcpSeg) bool {
		for _, sg := range segs {
			if sg.dst.Port() == h2.guest.Port() && sg.flags == header.TCPFlagSYN|header.TCPFlagACK {
				h2.ack = sg.seq + 1
				return true
			}
		}
		return false
	})
	h2.ws = opts.WindowScale
	h2.sendAck(nil)
	peer2, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer2.Close() })
	go drain(peer2)

	whole := uint32(ring * 7 / 16 * mss)
	send := func(h *tcpHarness) {
		h.sendAck(make([]byte, mss))
		h.flush()
	}

	send(h)
	if w := h.flow().wndToGuest; w == 0 || w > whole {
		t.Fatalf("one sender: window %d, want 1..%d (7/16 of a %d-entry ring in %d-byte segments)", w, whole, ring, mss)
	}
	if w := h.flow().wndToGuest; w < whole/2 {
		t.Fatalf("one sender: window %d, want the whole budget %d (the 8 MiB send buffer does not hold it down)", w, whole)
	}

	send(&h2)
	send(h)
	for _, f := range []*conn{h.flow(), h2.flow()} {
		if f.wndToGuest > whole/2 {
			t.Fatalf("two senders: window %d, want at most half the budget, %d", f.wndToGuest, whole/2)
		}
	}

	// The second sender goes quiet: after two periods the first has the
	// whole budget again.
	h.now = h.now.Add(2*senderPeriod + time.Millisecond)
	send(h)
	if w := h.flow().wndToGuest; w <= whole/2 {
		t.Fatalf("after the other sender went quiet: window %d, want more than half the budget %d", w, whole/2)
	}

	// With TSO (no budget) the send buffer alone decides.
	h.tab.SetTXRing(0)
	send(h)
	if w := h.flow().wndToGuest; w <= whole {
		t.Fatalf("no budget: window %d, want above %d", w, whole)
	}
}

// drain reads and discards what the host peer receives.
func drain(c net.Conn) { io.Copy(io.Discard, c) }

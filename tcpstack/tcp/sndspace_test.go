package tcp

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/test/testenv"
)

// TestTCPUploadWindowByEPOLLOUT runs in a network namespace whose
// tcp_wmem/tcp_rmem top out at 64 KiB (the rig's small-buffer scenario):
// the send buffer of the host socket is always smaller than the guest's
// MSS. The guest uploads to a loopback peer and the clock never moves, so
// no timer can reopen the window: every window update must come from the
// output after a write or from the socket's EPOLLOUT. Before the send
// space was taken from SO_MEMINFO, the window closed at half the buffer
// while the kernel still called the socket writable, EPOLLOUT never came,
// and the upload stopped until the 10 ms ACK timer.
//
// The test asserts progress, not speed: under -race on a loaded machine
// the 64 MiB take what they take. A stall is stallAfter without a byte
// moving anywhere — no segment the window let the guest send, and nothing
// more read by the peer, which has then read all that was written: the
// only thing left to move is the window update the code under test must
// send.
func TestTCPUploadWindowByEPOLLOUT(t *testing.T) {
	if !testenv.InPrivateNetns(t, map[string]string{"tcp_rmem": "4096 16384 65536", "tcp_wmem": "4096 16384 65536"}) {
		return
	}
	// 64 KiB segments (default MTU), and MTU-1500 segments, each one skb
	// with its overhead on the host socket: the window must count that
	// overhead, or the socket refuses data inside it.
	t.Run("mss65480", func(t *testing.T) { tcpRunUploadNoTimers(t, 64<<20, 65480) })
	t.Run("mss1460", func(t *testing.T) { tcpRunUploadNoTimers(t, 8<<20, 1460) })
}

// stallAfter is how long an upload may go without a byte moving before
// tcpRunUploadNoTimers calls it stalled. Before the fix the window never
// reopened (no timer runs), so any bound fails that code; this one is far
// above what scheduling delays on a loaded machine add.
const stallAfter = 10 * time.Second

// tcpRunUploadNoTimers uploads n bytes from a simulated Linux guest with
// MSS guestMSS to a loopback peer that reads as fast as it
// can. The guest sends only inside the advertised window and, like Linux
// (tcp_snd_wnd_test with tcp_bound_to_half_wnd), only a segment of its full
// MSS — the smaller of its MSS and half the largest window it has seen —
// unless less data is left. Timers never run. It fails when the upload
// stalls (stallAfter with neither a segment sent nor a byte read by the
// peer), when the socket refuses a byte inside the window (a short write:
// in-flight data beyond what we can write), or when the ACK passes what
// was written.
func tcpRunUploadNoTimers(t *testing.T, n int, guestMSS uint16) {
	h := tcpNewHarness(t, Config{})
	ln := h.listen()
	h.sendSYN(header.TCPOptions{HasMSS: true, MSS: guestMSS, HasWindowScale: true, WindowScale: 7})
	synack := h.collect("SYN-ACK", func(s []tcpSeg) bool { return len(s) > 0 })
	if synack[0].flags != header.TCPFlagSYN|header.TCPFlagACK {
		t.Fatalf("want a SYN-ACK, got %+v", synack[0])
	}
	h.ack, h.ws = synack[0].seq+1, 7
	h.sendAck(nil)
	peer, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	f := h.flow()
	data := guestframe.Pattern(n)
	recv := make(chan []byte, 1)
	var peerGot atomic.Int64 // bytes the peer has read so far
	go func() {
		got := make([]byte, 0, n)
		buf := make([]byte, 256<<10)
		for len(got) < n {
			// A deadline per read: the upload may be slow, but a
			// stalled one must not hold the peer forever.
			peer.SetReadDeadline(time.Now().Add(2 * stallAfter))
			k, err := peer.Read(buf)
			if err != nil {
				break
			}
			got = append(got, buf[:k]...)
			peerGot.Store(int64(len(got)))
		}
		recv <- got
	}()
	base := h.seq
	una, wnd := base, uint32(synack[0].wnd) // a SYN's window is not scaled
	maxWnd := wnd
	for _, s := range h.flush() {
		una, wnd = s.ack, uint32(s.wnd)<<wsToGuestDefault
	}
	maxWnd = max(maxWnd, wnd)
	start := time.Now()
	lastProgress, lastPeer := start, int64(0)
	segs, waits, idle := 0, 0, 0
	var waited time.Duration
	for h.seq != base+uint32(n) {
		if p := peerGot.Load(); p != lastPeer {
			lastPeer, lastProgress = p, time.Now()
		}
		if time.Since(lastProgress) > stallAfter {
			t.Fatalf("upload stalled at %d of %d bytes for %v: window %d (una %d, written %d, read by the peer %d); only a timer would reopen it",
				h.seq-base, n, stallAfter, wnd, una-base, f.seqFromGuest-base, lastPeer)
		}
		mss := min(uint32(guestMSS), maxWnd/2)
		for {
			left := uint32(n) - (h.seq - base)
			room := int32(una + wnd - h.seq)
			seg := min(mss, left)
			if left == 0 || room < int32(seg) || seg == 0 {
				break
			}
			off := int(h.seq - base)
			h.inject(h.frame(header.TCPFlagACK, h.seq, h.ack, h.wnd, nil, data[off:off+int(seg)]))
			if f.seqFromGuest != h.seq+seg {
				t.Fatalf("socket took %d of a %d-byte segment inside the advertised window (right edge %d, at %d)",
					f.seqFromGuest-h.seq, seg, una+wnd-base, h.seq-base)
			}
			h.seq += seg
			segs++
			lastProgress = time.Now()
		}
		// The ACKs of what was just written first (the loop's output pass
		// of the same iteration), then socket events.
		out := h.flush()
		if len(out) == 0 {
			t0 := time.Now()
			out = h.pump(5 * time.Millisecond)
			waits++
			waited += time.Since(t0)
			if len(out) == 0 {
				idle++
			}
		}
		for _, s := range out {
			if seqGT(s.ack, f.seqFromGuest) {
				t.Fatalf("ACK %d beyond what was written (%d)", s.ack-base, f.seqFromGuest-base)
			}
			if seqGT(s.ack, una) {
				una = s.ack
			}
			wnd = uint32(s.wnd) << wsToGuestDefault
			maxWnd = max(maxWnd, wnd)
		}
	}
	got := <-recv
	if !bytes.Equal(got, data) {
		t.Fatalf("peer got %d bytes, corrupted or short", len(got))
	}
	el := time.Since(start)
	t.Logf("%d bytes in %d segments, %v (%.0f MB/s), largest window %d; %d waits for the socket (%v), %d without a frame",
		n, segs, el, float64(n)/el.Seconds()/1e6, maxWnd, waits, waited, idle)
}

//go:build vunetfault

package tcp

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
)

// TestFaultTCPUrgentEAGAINPersists: the kernel's EAGAIN for a read that
// starts at an urgent mark with a signal pending (dataAtEAGAIN) may come
// again and again. Here the first four peeks fail so (injected: the kernel
// gives it only with a signal pending), one more than sendData retries,
// with nothing in flight yet; the connection still delivers every byte and
// our FIN: the socket is never taken for empty (drained), and the ACK
// check brings the next read. Both peek modes, a guest that ACKs every
// frame and one that ACKs every third pass. Without the retry the first
// EAGAIN left the connection drained; without the ACK check's deadline
// nothing read the socket again before the idle timeout.
func TestFaultTCPUrgentEAGAINPersists(t *testing.T) {
	for _, noPeekOff := range []bool{false, true} {
		for _, ackAll := range []bool{true, false} {
			t.Run(fmt.Sprintf("NoPeekOffset=%v/ackEveryFrame=%v", noPeekOff, ackAll), func(t *testing.T) {
				h := urgentThenClose(t, noPeekOff)
				cancel := hostsock.InjectPeekError(unix.EAGAIN, 4)
				defer cancel()
				var got []byte
				fin := false
				for pass, deadline := 0, time.Now().Add(5*time.Second); !fin && time.Now().Before(deadline); pass++ {
					segs := h.pump(20 * time.Millisecond)
					for _, s := range segs {
						if end := s.seq + uint32(len(s.payload)); !seqLT(h.ack, s.seq) && seqLT(h.ack, end) {
							got = append(got, s.payload[h.ack-s.seq:]...)
							h.ack = end
						}
						fin = fin || (s.flags.Has(header.TCPFlagFIN) && s.seq+uint32(len(s.payload)) == h.ack)
					}
					if (ackAll && len(segs) > 0) || pass%3 == 2 {
						h.sendAck(nil)
					}
					h.now = h.now.Add(50 * time.Millisecond)
					h.tab.Timers(h.now)
				}
				if !fin || string(got) != "abcxhello" {
					t.Fatalf("guest got %q, FIN %v; want %q and our FIN", got, fin, "abcxhello")
				}
				if left := hostsock.InjectedPeekErrorsLeft(); left != 0 {
					t.Fatalf("%d injected EAGAINs never reached a peek: the case is not set up", left)
				}
			})
		}
	}
}

//go:build vunetfault

package tcp

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/internal/guestframe"
)

// TestFaultTCPSendTransient: sendmsg refusing a guest segment for want of
// buffer space or memory (EAGAIN, ENOBUFS, ENOMEM; injected, since the
// kernel gives them only under memory pressure) loses nothing: the
// connection stays, the guest's retransmission is written, and the host
// peer reads every byte once, in order. (ENOBUFS and ENOMEM used to reset
// the connection.)
func TestFaultTCPSendTransient(t *testing.T) {
	for _, e := range []unix.Errno{unix.EAGAIN, unix.ENOBUFS, unix.ENOMEM} {
		t.Run(e.Error(), func(t *testing.T) {
			h := tcpNewHarness(t, Config{MTU: 1500})
			ln := h.listen()
			peer := h.establish(ln, tcpMss1400ws7)
			data := guestframe.Pattern(3000)
			h.sendAck(data[:1000])
			cancel := hostsock.InjectSendError(e, 1)
			defer cancel()
			h.sendAck(data[1000:2000])
			if left := hostsock.InjectedSendErrorsLeft(); left != 0 {
				t.Fatalf("the segment did not reach sendmsg (%d injections left)", left)
			}
			for _, s := range h.flush() {
				if s.flags.Has(header.TCPFlagRST) {
					t.Fatalf("the connection was reset after %v on sendmsg", e)
				}
			}
			if h.flow() == nil {
				t.Fatalf("the connection is gone after %v on sendmsg", e)
			}
			// The guest retransmits what was not acknowledged, then goes on.
			h.seq -= 1000
			h.sendAck(data[1000:2000])
			h.sendAck(data[2000:])
			peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			if got := tcpReadN(t, peer, len(data)); !bytes.Equal(got, data) {
				t.Fatal("the peer did not read the guest's bytes once each, in order")
			}
			segs := h.flush()
			if n := len(segs); n == 0 || segs[n-1].ack != h.seq {
				t.Fatalf("the guest's data was not acknowledged up to %d: %+v", h.seq, segs)
			}
		})
	}
}

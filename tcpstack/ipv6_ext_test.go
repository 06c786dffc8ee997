package tcpstack

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/test/testenv"
)

// withDestOpts inserts an empty Destination Options header (PadN) between
// the IPv6 header and the upper layer of a guest frame, as a guest stack
// may send.
func withDestOpts(frame []byte) []byte {
	ip := header.EthernetMinimumSize
	next := frame[ip+6]
	out := append([]byte(nil), frame[:ip+header.IPv6MinimumSize]...)
	out[ip+6] = byte(header.IPProtocolDestOptions)
	out = append(out, next, 0, 1, 4, 0, 0, 0, 0) // PadN of 4 bytes fills the 8
	out = append(out, frame[ip+header.IPv6MinimumSize:]...)
	binary.BigEndian.PutUint16(out[ip+4:], uint16(len(out)-ip-header.IPv6MinimumSize))
	return out
}

// TestIPv6ExtensionHeadersDispatched: a TCP segment or UDP datagram behind
// an IPv6 extension header is translated like one without (dispatch goes
// by the upper-layer protocol, not by the fixed header's next header).
func TestIPv6ExtensionHeadersDispatched(t *testing.T) {
	t.Run("tcp", func(t *testing.T) {
		ln, err := net.Listen("tcp6", "[::1]:0")
		if err != nil {
			testenv.Unavailable(t, err, "IPv6 on the loopback interface (sysctl -w net.ipv6.conf.lo.disable_ipv6=0)")
		}
		defer ln.Close()
		port := uint16(ln.Addr().(*net.TCPAddr).Port)
		p := newFlowPair(t, featMrg, nil)
		p.postRX(8, 2048)
		p.start()
		p.addTX(withDestOpts(tcpGuestFrame(testGuest6, testGw6, 45000, port, 1000, 0, header.TCPFlagSYN, nil)))
		p.tx.Send()
		waitFor(t, "SYN-ACK", 3*time.Second, func() bool { return p.rxFrames(1) == 1 })
		p.s.StopPair(0)
		_, frames := p.rxReadIP(t)
		s := guestTCP(t, frames[0], testGw6, testGuest6)
		if s == nil || !s.Flags().Has(header.TCPFlagSYN|header.TCPFlagACK) || s.AckNumber() != 1001 {
			t.Fatalf("want a SYN-ACK for 1000, got %x", frames[0])
		}
	})
	t.Run("udp", func(t *testing.T) {
		port := udpEcho(t, "udp6", "[::1]:0")
		p := newFlowPair(t, featMrg, nil)
		p.postRX(8, 2048)
		p.start()
		payload := []byte("behind destination options")
		p.addTX(withDestOpts(udpFrame(testGuest6, testGw6, 40000, port, payload)))
		p.tx.Send()
		waitFor(t, "echo", 3*time.Second, func() bool { return p.rxFrames(1) == 1 })
		p.s.StopPair(0)
		hdrs, frames := p.rxReadIP(t)
		checkUDPFrame(t, hdrs[0], frames[0], testGw6, testGuest6, port, 40000, payload)
		if !bytes.HasSuffix(frames[0], payload) {
			t.Errorf("echo %x", frames[0])
		}
	})
}

package tcp

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
)

// TestTCPForwardInbound: a connection to a forwarded host port becomes a
// SYN to the guest from the gateway address; the guest's SYN-ACK
// establishes it, data flows both ways and the close is translated.
func TestTCPForwardInbound(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500, AckTimeout: time.Second})
	h.tab.SetGuest(h.guestMAC, h.guest.Addr(), netip.Addr{})
	c := h.dialForward(t, 8080)
	syn := h.collect("SYN", func(s []tcpSeg) bool { return len(s) > 0 })
	s := syn[0]
	if s.flags != header.TCPFlagSYN || s.dst.Addr() != h.guest.Addr() || s.dst.Port() != 8080 ||
		s.src.Addr() != netip.MustParseAddr("10.0.2.2") || !s.opts.HasMSS || s.opts.MSS != 1460 {
		t.Fatalf("bad SYN %+v", s)
	}
	if h.stats.Accepted.Load() != 1 || h.stats.ConnsByState[stats.TCPSynSent].Load() != 1 {
		t.Fatalf("accepted %d", h.stats.Accepted.Load())
	}
	// Our SYN is repeated while the guest does not answer.
	h.now = h.now.Add(time.Second)
	h.tab.Timers(h.now)
	if re := h.flush(); len(re) != 1 || re[0].flags != header.TCPFlagSYN || re[0].seq != s.seq {
		t.Fatalf("SYN not repeated: %+v", re)
	}
	// The guest (port 8080 listening) answers.
	h.guest = netip.AddrPortFrom(h.guest.Addr(), 8080)
	h.remote = s.src
	h.seq = h.isn + 1
	h.ack = s.seq + 1
	var ob [40]byte
	n := header.EncodeTCPOptions(ob[:], &header.TCPOptions{HasMSS: true, MSS: 1000, HasWindowScale: true, WindowScale: 7})
	h.inject(h.frame(header.TCPFlagSYN|header.TCPFlagACK, h.isn, h.ack, 65535, ob[:n], nil))
	ack := h.flush()
	if len(ack) != 1 || ack[0].flags != header.TCPFlagACK || ack[0].ack != h.isn+1 {
		t.Fatalf("handshake ACK %+v", ack)
	}
	if f := h.flow(); f == nil || f.state != stats.TCPEstablished || f.mssToGuest != 1000 {
		t.Fatalf("not established")
	}
	// Host → guest.
	data := guestframe.Pattern(3000)
	c.Write(data)
	got := h.collect("data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(data) })
	if !bytes.Equal(tcpPayloadOf(got), data) || len(got[0].payload) != 1000 {
		t.Fatalf("data to guest wrong")
	}
	h.ackAll(got)
	// Guest → host.
	h.sendAck([]byte("reply"))
	h.flush()
	if b := tcpReadN(t, c, 5); string(b) != "reply" {
		t.Fatalf("host got %q", b)
	}
	// Guest closes, then the host client.
	h.sendFin()
	h.flush()
	c.(*net.TCPConn).CloseWrite()
	all := h.collect("FIN", func(s []tcpSeg) bool { return hasFlag(s, header.TCPFlagFIN) })
	h.ackAll(all)
	h.flush()
	if h.flow() != nil || h.tab.Len() != 0 {
		t.Fatalf("forwarded connection not closed")
	}
}

// TestTCPForwardGuestRefuses: a guest RST to our SYN resets the host client.
func TestTCPForwardGuestRefuses(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	h.tab.SetGuest(h.guestMAC, h.guest.Addr(), netip.Addr{})
	c := h.dialForward(t, 9)
	syn := h.answerForwardSyn(9)
	h.inject(h.frame(header.TCPFlagRST|header.TCPFlagACK, 0, syn.seq+1, 0, nil, nil))
	if h.flow() != nil || h.stats.RSTReceived.Load() != 1 {
		t.Fatalf("guest RST not handled")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("host client not reset")
	}
}

// TestTCPForwardGuestUnknown: without a known guest the host client is
// refused at once.
func TestTCPForwardGuestUnknown(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	h.dialForward(t, 0)
	deadline := time.Now().Add(5 * time.Second)
	for h.stats.AcceptRefusals[stats.TCPGuestUnknown].Load() == 0 && time.Now().Before(deadline) {
		h.pump(10 * time.Millisecond)
	}
	if h.stats.AcceptRefusals[stats.TCPGuestUnknown].Load() != 1 || h.tab.Len() != 0 {
		t.Fatalf("refused %d len %d", h.stats.AcceptRefusals[stats.TCPGuestUnknown].Load(), h.tab.Len())
	}
}

// TestTCPForwardAckOnPeerAck: on an accepted socket tcpi_bytes_acked does
// not count the SYN; ACKs to the guest that follow it still reach exactly
// the last byte written once the host client has it.
func TestTCPForwardAckOnPeerAck(t *testing.T) {
	h := tcpNewHarness(t, Config{AckOnPeerAck: true})
	h.tab.SetGuest(h.guestMAC, h.guest.Addr(), netip.Addr{})
	c := h.dialForward(t, 8080)
	syn := h.answerForwardSyn(8080)
	h.seq, h.ack = h.isn+1, syn.seq+1
	h.inject(h.frame(header.TCPFlagSYN|header.TCPFlagACK, h.isn, h.ack, 65535, nil, nil))
	h.flush()
	h.sendAck([]byte("0123456789"))
	if b := tcpReadN(t, c, 10); string(b) != "0123456789" {
		t.Fatalf("client got %q", b)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.now = h.now.Add(20 * time.Millisecond)
		h.tab.Timers(h.now)
		s := h.pump(5 * time.Millisecond)
		if len(s) > 0 && s[len(s)-1].ack == h.seq {
			break
		}
		if len(s) > 0 && seqGT(s[len(s)-1].ack, h.seq) {
			t.Fatalf("ACK %d beyond the data %d", s[len(s)-1].ack-h.isn, h.seq-h.isn)
		}
		if time.Now().After(deadline) {
			t.Fatalf("guest data never fully ACKed")
		}
	}
}

// dialForward listens on a loopback port forwarded to guestPort and
// connects a host client to it; the client is closed with the test.
func (h *tcpHarness) dialForward(t *testing.T, guestPort uint16) net.Conn {
	_, port, err := h.tab.Listen(netip.MustParseAddrPort("127.0.0.1:0"), "", guestPort)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// answerForwardSyn waits for the SYN a forwarded connection sends the
// guest and makes the harness speak as the guest's guestPort to it.
func (h *tcpHarness) answerForwardSyn(guestPort uint16) tcpSeg {
	syn := h.collect("SYN", func(s []tcpSeg) bool { return len(s) > 0 })
	h.guest = netip.AddrPortFrom(h.guest.Addr(), guestPort)
	h.remote = syn[0].src
	return syn[0]
}

// TestTCPForwardGuestWithoutScaling: our SYN's window was computed with a
// scale the guest's SYN-ACK then refuses. What stands of it for the
// guest's first data (wndHolds) is what an unscaled frame can carry, at
// most 65535 bytes: the window the guest was told. Without the clamp the
// flow kept a window of 65536 or more at scale 0.
func TestTCPForwardGuestWithoutScaling(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500, AckTimeout: time.Second})
	h.tab.SetGuest(h.guestMAC, h.guest.Addr(), netip.Addr{})
	c := h.dialForward(t, 8080)
	s := h.collect("SYN", func(s []tcpSeg) bool { return len(s) > 0 })[0]
	h.guest = netip.AddrPortFrom(h.guest.Addr(), 8080)
	h.remote = s.src
	h.seq = h.isn + 1
	h.ack = s.seq + 1
	var ob [40]byte
	n := header.EncodeTCPOptions(ob[:], &header.TCPOptions{HasMSS: true, MSS: 1000})
	h.inject(h.frame(header.TCPFlagSYN|header.TCPFlagACK, h.isn, h.ack, 65535, ob[:n], nil))
	h.flush()
	f := h.flow()
	if f == nil || f.state != stats.TCPEstablished || f.wsToGuest != 0 {
		t.Fatalf("not established without scaling: %+v", f)
	}
	if f.wndToGuest > 0xffff || f.wndEdgeSpan > 0xffff {
		t.Fatalf("window %d (standing %d) at scale 0: more than a frame can say", f.wndToGuest, f.wndEdgeSpan)
	}
	h.sendAck([]byte("reply"))
	h.flush()
	if b := tcpReadN(t, c, 5); string(b) != "reply" {
		t.Fatalf("host got %q", b)
	}
}

package tcpstack

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
	"vunet/virtqueue"
)

// tcpGuestFrame builds a guest TCP segment over IPv4 or IPv6.
func tcpGuestFrame(src, dst netip.Addr, sport, dport uint16, seq, ack uint32, flags header.TCPFlags, payload []byte) []byte {
	return guestframe.TCP(netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport),
		header.TCPFields{SeqNum: seq, AckNum: ack, Flags: flags, WindowSize: 65535}, payload)
}

// guestTCP parses a frame to the guest as TCP and checks its checksum; nil
// for a frame that is not TCP.
func guestTCP(t *testing.T, frame []byte, src, dst netip.Addr) header.TCP {
	return guestTCPWith(t, virtqueue.NetHdr{}, frame, src, dst)
}

// segWatch collects the TCP segments from src to dst that the loop writes
// to the guest through p, and gives the used buffers back as the guest
// driver does.
type segWatch struct {
	t        *testing.T
	p        *testPair
	src, dst netip.Addr
	skip     func(frame []byte) bool // frames left out; nil: none
	check    func(header.TCP)        // sees every segment collected; nil: none
	segs     []header.TCP            // collected, not taken yet
}

// next returns the first segment collected that ok accepts, and forgets
// it and those before it; it fails the test after 5 s without one.
func (w *segWatch) next(what string, ok func(header.TCP) bool) header.TCP {
	w.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		_, frames := w.p.rxReadIP(w.t)
		for _, f := range frames {
			if w.skip != nil && w.skip(f) {
				continue
			}
			if s := guestTCP(w.t, f, w.src, w.dst); s != nil {
				if w.check != nil {
					w.check(s)
				}
				w.segs = append(w.segs, s)
			}
		}
		for i, s := range w.segs {
			if ok(s) {
				w.segs = w.segs[i+1:]
				return s
			}
		}
		for w.p.rx.Free() > 0 && w.p.rx.Q != nil {
			w.p.rx.AddBuffers(nil, 2048)
		}
		w.p.rx.Send()
		time.Sleep(time.Millisecond)
	}
	w.t.Fatalf("no %s from %v to %v; segments seen: %d", what, w.src, w.dst, len(w.segs))
	return nil
}

// guestTCPWith is guestTCP for a frame with virtio-net header vh: a partial
// checksum (NEEDS_CSUM) is completed first, as the guest would.
func guestTCPWith(t *testing.T, vh virtqueue.NetHdr, frame []byte, src, dst netip.Addr) header.TCP {
	t.Helper()
	var p header.Packet
	if err := header.ParseFrame(frame, len(frame), &p); err != nil {
		t.Fatal(err)
	}
	if p.Protocol != header.IPProtocolTCP {
		return nil
	}
	seg, err := header.ParseTCP(frame[p.L4Off : p.L4Off+p.L4Len])
	if err != nil {
		t.Fatal(err)
	}
	if vh.Flags&virtqueue.NetHdrFNeedsCsum != 0 {
		binary.BigEndian.PutUint16(seg[16:], ^header.Checksum(seg, 0))
	}
	if !seg.IsChecksumValid(src, dst) {
		t.Errorf("TCP checksum invalid: %x", []byte(seg))
	}
	return seg
}

// rxTCP returns the TCP segments the guest received from the gateway,
// checksums verified, with their virtio-net headers.
func (p *testPair) rxTCP(t *testing.T) (segs []header.TCP, hdrs []virtqueue.NetHdr) {
	t.Helper()
	h, frames := p.rxReadIP(t)
	for i, f := range frames {
		if s := guestTCPWith(t, h[i], f, testGw4, testGuest4); s != nil {
			segs, hdrs = append(segs, s), append(hdrs, h[i])
		}
	}
	return segs, hdrs
}

// payloadOf concatenates the payload of segs.
func payloadOf(segs []header.TCP) []byte {
	var b []byte
	for _, s := range segs {
		b = append(b, s.Payload()...)
	}
	return b
}

// TestTCPThroughLoop drives a connection through the real event loop and
// rings: guest SYN to the gateway, SYN-ACK from the loop, data both ways
// with a host listener on loopback.
func TestTCPThroughLoop(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		testenv.Unavailable(t, err, "a loopback interface with 127.0.0.1")
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()

	p := newFlowPair(t, featMrg, nil)
	p.postRX(32, 2048)
	p.start()
	const gseq = 1000
	p.addTX(tcpGuestFrame(testGuest4, testGw4, 45000, port, gseq, 0, header.TCPFlagSYN, nil))
	p.tx.Send()

	// Collect TCP segments to the guest as they come.
	next := (&segWatch{t: t, p: p, src: testGw4, dst: testGuest4}).next
	synAck := next("SYN-ACK", func(s header.TCP) bool {
		return s.Flags().Has(header.TCPFlagSYN | header.TCPFlagACK)
	})
	if synAck.AckNumber() != gseq+1 || synAck.SourcePort() != port || synAck.DestinationPort() != 45000 {
		t.Fatalf("SYN-ACK ack %d ports %d->%d", synAck.AckNumber(), synAck.SourcePort(), synAck.DestinationPort())
	}
	hseq := synAck.SequenceNumber() + 1

	var conn net.Conn
	select {
	case conn = <-accepted:
	case <-time.After(3 * time.Second):
		t.Fatal("host listener got no connection")
	}
	defer conn.Close()

	p.addTX(tcpGuestFrame(testGuest4, testGw4, 45000, port, gseq+1, hseq, header.TCPFlagACK|header.TCPFlagPSH, []byte("hello")))
	p.tx.Send()
	buf := make([]byte, 5)
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("host read %q, %v", buf, err)
	}

	if _, err := conn.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	data := next("data segment", func(s header.TCP) bool { return len(s.Payload()) > 0 })
	if !bytes.Equal(data.Payload(), []byte("world")) || data.SequenceNumber() != hseq {
		t.Errorf("data %q seq %d, want \"world\" seq %d", data.Payload(), data.SequenceNumber(), hseq)
	}
	if got := p.stats().TX.Drops[stats.DropMalformed].Load(); got != 0 {
		t.Errorf("malformed drops %d", got)
	}

	// The front-end leaves: the host peer must learn at once (RST), not
	// after its own timeouts.
	rstBefore := p.s.PairTCPStats(0).ConnsByState[stats.TCPEstablished].Load()
	p.s.EndSession()
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	if n, err := conn.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("host read after EndSession: %d, %v; want ECONNRESET", n, err)
	}
	if rstBefore != 1 {
		t.Errorf("established before EndSession = %d, want 1", rstBefore)
	}
	if got := p.s.PairTCPStats(0).ConnsByState[stats.TCPEstablished].Load(); got != 0 {
		t.Errorf("established after EndSession = %d, want 0", got)
	}
}

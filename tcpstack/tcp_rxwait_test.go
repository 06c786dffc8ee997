package tcpstack

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// TestTCPLoopRXWaitCounted: host data to a guest whose 16-entry RX ring is
// refilled only a few buffers at a time, after the loop has drained it.
// Every TCP output pass that runs out of descriptors starts a wait, counted
// once in RXWaitedForDescriptors (not once per retry), and the frames that
// waited go out on the guest's refill kick alone: each refill brings data
// within a fraction of the ACK timeout, no timeout retransmission happens,
// and the data arrives intact and in order.
func TestTCPLoopRXWaitCounted(t *testing.T) {
	p := newTestPair(t, featMrg|testFeatCsm, 16)
	cfg := Config{Logger: testenv.Logger()}
	cfg.Addr.IPv4.Addr = testGuest4
	cfg.Addr.IPv4.PrefixLen = 24
	cfg.Addr.IPv4.Gateway = testGw4
	p.s = New(cfg)
	t.Cleanup(p.s.Close)

	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	guest := netip.AddrPortFrom(testGuest4, 40000)
	remote := netip.AddrPortFrom(testGw4, uint16(ln.Addr().(*net.TCPAddr).Port))
	const isn = 9000
	segment := func(fl header.TCPFlags, seq, ack uint32, opts []byte) []byte {
		return guestframe.TCP(guest, remote, header.TCPFields{SeqNum: seq, AckNum: ack, Flags: fl, WindowSize: 65535, Options: opts}, nil)
	}
	refill := func(n int) {
		for i := 0; i < n && p.rx.Free() > 0; i++ {
			p.rx.AddBuffers(nil, 2048)
		}
		p.rx.Send()
	}
	sendTX := func(frame []byte) {
		for {
			if _, _, ok := p.tx.popUsed(); !ok {
				break
			}
		}
		p.addTX(frame)
		p.tx.Send()
	}
	var segs []header.TCP
	read := func() int {
		got, _ := p.rxTCP(t)
		segs = append(segs, got...)
		return len(got)
	}
	refill(4)
	p.start()

	var ob [40]byte
	n := header.EncodeTCPOptions(ob[:], &header.TCPOptions{HasMSS: true, MSS: 1460})
	sendTX(segment(header.TCPFlagSYN, isn, 0, ob[:n]))
	waitFor(t, "SYN-ACK", 3*time.Second, func() bool { read(); return len(segs) > 0 })
	if s := segs[0]; s.Flags() != header.TCPFlagSYN|header.TCPFlagACK || s.AckNumber() != isn+1 {
		t.Fatalf("bad SYN-ACK %x", []byte(s))
	}
	seq, ack := uint32(isn+1), segs[0].SequenceNumber()+1
	segs = nil
	sendTX(segment(header.TCPFlagACK, seq, ack, nil))
	peer, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()

	st := p.stats()
	waited0 := st.RXWaitedForDescriptors.Load()
	data := guestframe.Pattern(256 << 10)
	go peer.Write(data)
	var got []byte
	refills := 0
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < len(data) {
		if time.Now().After(deadline) {
			t.Fatalf("stuck at %d of %d bytes", len(got), len(data))
		}
		// Let the loop drain the ring and wait, then refill a few buffers:
		// only the refill kick can move the waiting frames.
		time.Sleep(2 * time.Millisecond)
		refill(6)
		refills++
		waitFor(t, "frames after a refill", 500*time.Millisecond, func() bool { return read() > 0 })
		for _, s := range segs {
			if len(s.Payload()) == 0 {
				continue
			}
			if s.SequenceNumber() != ack {
				t.Fatalf("segment at %d, expected %d: out of order or resent", s.SequenceNumber()-ack, 0)
			}
			got = append(got, s.Payload()...)
			ack += uint32(len(s.Payload()))
		}
		segs = nil
		sendTX(segment(header.TCPFlagACK, seq, ack, nil))
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("data corrupted")
	}
	waited := st.RXWaitedForDescriptors.Load() - waited0
	tst := p.s.PairTCPStats(0)
	t.Logf("%d refills, %d descriptor waits, retransmissions: %d timeout, %d dup-ack",
		refills, waited, tst.Retransmits[stats.TCPRetransTimeout].Load(), tst.Retransmits[stats.TCPRetransDupAck].Load())
	if waited == 0 {
		t.Fatalf("RXWaitedForDescriptors did not count the TCP frames that waited for the %d refills", refills)
	}
	if waited > uint64(refills)+1 {
		t.Fatalf("RXWaitedForDescriptors = %d for %d refills: retries counted, not waits", waited, refills)
	}
	if n := tst.Retransmits[stats.TCPRetransTimeout].Load(); n != 0 {
		t.Fatalf("%d timeout retransmissions: waiting frames were not sent on the refill", n)
	}
}

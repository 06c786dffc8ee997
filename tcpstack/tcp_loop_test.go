package tcpstack

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// TestTCPLoopRXRefill runs a guest TCP connection through the real event
// loop and rings (the driver of driver_test.go): handshake, data both ways,
// and frames that wait for RX buffers going out when the guest posts them.
func TestTCPLoopRXRefill(t *testing.T) {
	p := newFlowPair(t, featMrg|testFeatCsm, nil)
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	h := &tcpHarness{t: t, guestMAC: testGuestMAC,
		guest:  netip.AddrPortFrom(testGuest4, 40000),
		remote: netip.AddrPortFrom(testGw4, uint16(ln.Addr().(*net.TCPAddr).Port)),
		isn:    7000}
	for i := 0; i < 8; i++ {
		p.rx.AddBuffers(nil, 2048)
	}
	p.rx.Post()
	p.start()
	rxSegs := func() []tcpSeg {
		hdrs, frames := p.rxReadIP(t)
		fr := make([]tcpFakeFrame, len(frames))
		for i := range frames {
			fr[i] = tcpFakeFrame{b: frames[i], vh: hdrs[i]}
		}
		return h.parse(fr)
	}
	var segs []tcpSeg
	waitSegs := func(what string, cond func([]tcpSeg) bool) {
		t.Helper()
		waitFor(t, what, 3*time.Second, func() bool {
			segs = append(segs, rxSegs()...)
			return cond(segs)
		})
	}

	var ob [40]byte
	n := header.EncodeTCPOptions(ob[:], &header.TCPOptions{HasMSS: true, MSS: 1460, HasWindowScale: true, WindowScale: 7})
	p.addTX(h.frame(header.TCPFlagSYN, h.isn, 0, 65535, ob[:n], nil))
	p.tx.Send()
	waitSegs("SYN-ACK", func(s []tcpSeg) bool { return len(s) >= 1 })
	if s := segs[0]; s.flags != header.TCPFlagSYN|header.TCPFlagACK || s.ack != h.isn+1 {
		t.Fatalf("bad SYN-ACK %+v", s)
	}
	h.seq, h.ack = h.isn+1, segs[0].seq+1
	segs = nil
	p.addTX(h.frame(header.TCPFlagACK, h.seq, h.ack, 65535, nil, []byte("hello from guest")))
	p.tx.Send()
	peer, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	if b := tcpReadN(t, peer, 16); string(b) != "hello from guest" {
		t.Fatalf("peer got %q", b)
	}
	// More host data than the guest has buffers for: the rest follows
	// the refill, driven by the RX kick alone.
	data := tcpPattern(20 * 1460)
	peer.Write(data)
	waitSegs("first frames", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= 4*1460 })
	time.Sleep(50 * time.Millisecond)
	segs = append(segs, rxSegs()...)
	if got := len(tcpPayloadOf(segs)); got > 6*1460 {
		t.Fatalf("%d bytes without buffers", got)
	}
	for i := 0; i < 32; i++ {
		p.rx.AddBuffers(nil, 2048)
	}
	p.rx.Send()
	waitSegs("all data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(data) })
	if !bytes.Equal(tcpPayloadOf(segs), data) {
		t.Fatalf("data corrupted")
	}
	for _, s := range segs {
		if len(s.payload) > 0 && s.vh.Flags != virtqueue.NetHdrFNeedsCsum {
			t.Fatalf("checksum offload not used: %+v", s.vh)
		}
	}
	st := p.s.PairTCPStats(0)
	if st == nil || st.Connects.Load() != 1 || st.BytesToGuest.Load() != uint64(len(data)) ||
		st.ConnsByState[stats.TCPEstablished].Load() != 1 {
		t.Fatalf("TCP stats not wired: %+v", st)
	}
}

package tcpstack

import (
	"bytes"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
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
	guest := netip.AddrPortFrom(testGuest4, 40000)
	remote := netip.AddrPortFrom(testGw4, uint16(ln.Addr().(*net.TCPAddr).Port))
	const isn = 7000
	p.postRX(8, 2048)
	p.start()
	var segs []header.TCP
	var vhs []virtqueue.NetHdr
	waitSegs := func(what string, cond func([]header.TCP) bool) {
		t.Helper()
		waitFor(t, what, 3*time.Second, func() bool {
			s, h := p.rxTCP(t)
			segs, vhs = append(segs, s...), append(vhs, h...)
			return cond(segs)
		})
	}

	var ob [40]byte
	n := header.EncodeTCPOptions(ob[:], &header.TCPOptions{HasMSS: true, MSS: 1460, HasWindowScale: true, WindowScale: 7})
	p.addTX(guestframe.TCP(guest, remote, header.TCPFields{SeqNum: isn, Flags: header.TCPFlagSYN, WindowSize: 65535, Options: ob[:n]}, nil))
	p.tx.Send()
	waitSegs("SYN-ACK", func(s []header.TCP) bool { return len(s) >= 1 })
	if s := segs[0]; s.Flags() != header.TCPFlagSYN|header.TCPFlagACK || s.AckNumber() != isn+1 {
		t.Fatalf("bad SYN-ACK %x", []byte(s))
	}
	seq, ack := uint32(isn+1), segs[0].SequenceNumber()+1
	segs, vhs = nil, nil
	p.addTX(guestframe.TCP(guest, remote, header.TCPFields{SeqNum: seq, AckNum: ack, Flags: header.TCPFlagACK, WindowSize: 65535},
		[]byte("hello from guest")))
	p.tx.Send()
	peer, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	b := make([]byte, 16)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(peer, b); err != nil || string(b) != "hello from guest" {
		t.Fatalf("peer got %q, %v", b, err)
	}
	// More host data than the guest has buffers for: the rest follows
	// the refill, driven by the RX kick alone.
	data := guestframe.Pattern(20 * 1460)
	peer.Write(data)
	waitSegs("first frames", func(s []header.TCP) bool { return len(payloadOf(s)) >= 4*1460 })
	time.Sleep(50 * time.Millisecond)
	s, h := p.rxTCP(t)
	segs, vhs = append(segs, s...), append(vhs, h...)
	if got := len(payloadOf(segs)); got > 6*1460 {
		t.Fatalf("%d bytes without buffers", got)
	}
	for i := 0; i < 32; i++ {
		p.rx.AddBuffers(nil, 2048)
	}
	p.rx.Send()
	waitSegs("all data", func(s []header.TCP) bool { return len(payloadOf(s)) >= len(data) })
	if !bytes.Equal(payloadOf(segs), data) {
		t.Fatalf("data corrupted")
	}
	for i, s := range segs {
		if len(s.Payload()) > 0 && vhs[i].Flags != virtqueue.NetHdrFNeedsCsum {
			t.Fatalf("checksum offload not used: %+v", vhs[i])
		}
	}
	st := p.s.PairTCPStats(0)
	if st == nil || st.Connects.Load() != 1 || st.BytesToGuest.Load() != uint64(len(data)) ||
		st.ConnsByState[stats.TCPEstablished].Load() != 1 {
		t.Fatalf("TCP stats not wired: %+v", st)
	}
}

package tcpstack

import (
	"net/netip"
	"runtime"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/virtqueue"
)

// setChainAt writes a TX chain whose readable buffers are data split at the
// given points, into fixed descriptors and a fixed buffer area, and makes it
// available. Reusing the same memory keeps a long fuzz run from exhausting
// the test memory.
func (r *testRing) setChainAt(area uint64, data []byte, splits []int) uint16 {
	var parts [][]byte
	prev := 0
	for _, s := range splits {
		if s > prev && s < len(data) {
			parts = append(parts, data[prev:s])
			prev = s
		}
	}
	parts = append(parts, data[prev:])
	addr := area
	for i, p := range parts {
		copy(r.G.Bytes(addr, uint64(len(p))), p)
		var flags, next uint16
		if i+1 < len(parts) {
			flags, next = virtqueue.DescFlagNext, uint16(i+1)
		}
		r.SetDesc(uint16(i), addr, uint32(len(p)), flags, next)
		addr += uint64(len(p))
	}
	r.PutAvail(0)
	r.Post()
	return 0
}

// FuzzTXFrame runs arbitrary guest frames, split over up to three
// descriptors, through the TX path: header copy, dispatch, link services,
// flow parsing (host sockets are not opened), the RX writer for replies.
// Every chain must come back used, nothing may panic or hang.
func FuzzTXFrame(f *testing.F) {
	hdr := make([]byte, 12)
	seed := func(frame []byte) { f.Add(append(append([]byte(nil), hdr...), frame...), 13, 40) }
	seed(arpRequest(testGuestIP, testGwIP))
	seed(udpFrame(testGuest4, testGw4, 40000, 53, []byte("query")))
	seed(udpFrame(testGuest6, testGw6, 40000, 547, []byte{1, 2, 3, 4}))
	seed(udpFrame(testGuest4, netip.AddrFrom4([4]byte{255, 255, 255, 255}), 68, 67, make([]byte, 300)))
	seed(icmpEchoFrame(testGuest4, testGw4, 1, 1, []byte("x")))
	seed(icmpEchoFrame(testGuest6, testGw6, 1, 1, []byte("x")))
	seed(otherFrame(uint16(header.EtherTypeIPv6), 60))
	for _, dst := range []netip.Addr{testGw4, testGw6} {
		src := testGuest4
		if dst.Is6() {
			src = testGuest6
		}
		for _, pc := range split(udpDatagram(src, dst, 40000, 9, make([]byte, 40)), 16) {
			seed(fragFrame(src, dst, uint8(header.IPProtocolUDP), 9, pc))
		}
	}
	seed(otherFrame(uint16(header.EtherTypeIPv4), 34))
	f.Add([]byte{1, 2, 3}, 0, 0)

	p := newTestPair(f, featMrg, 64)
	p.s.noHostSockets = true
	p.start()
	// The loop holds the only P while it waits (reserveP, loop_wait.go),
	// and this goroutine then runs only when the loop yields: up to 50 ms
	// an exec, which kept the fuzzer to a few execs a second. A second P
	// lets it drive the ring while the loop waits, as the guest would;
	// stopping the loop sets GOMAXPROCS back.
	runtime.GOMAXPROCS(2)
	const area = testScratchBase
	p.postRX(32, 256)
	f.Fuzz(func(t *testing.T, data []byte, s1, s2 int) {
		if len(data) > 1<<16 {
			return
		}
		want := p.tx.UsedIdx() + 1
		p.tx.setChainAt(area, data, []int{s1, s2})
		p.tx.KickNow()
		waitFor(t, "TX chain used", 5*time.Second, func() bool { return p.tx.UsedIdx() == want })
		// Recycle RX buffers the replies used.
		for {
			head, _, ok := p.rx.popUsed()
			if !ok {
				break
			}
			p.rx.repost([]uint16{head})
			p.rx.KickNow()
		}
	})
}

package tcp

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
	"vunet/virtqueue"
)

// FuzzTCPGuestFrame feeds arbitrary guest frames to a table holding one
// connection in each interesting state, with host sockets replaced by
// nothing (connects are refused, established flows have no socket), and
// runs output passes and timers after each: nothing may panic or hang,
// and the table's bookkeeping must stay consistent.
func FuzzTCPGuestFrame(f *testing.F) {
	h := &tcpHarness{
		guest:    netip.MustParseAddrPort("10.0.2.15:40000"),
		remote:   netip.MustParseAddrPort("10.0.2.2:80"),
		guestMAC: [6]byte{0x52, 0x54, 0, 0x12, 0x34, 0x56},
	}
	var ob [40]byte
	n := header.EncodeTCPOptions(ob[:], &tcpMss1400ws7)
	f.Add(h.frame(header.TCPFlagSYN, 1000, 0, 65535, ob[:n], nil), 0)
	f.Add(h.frame(header.TCPFlagACK, 1001, 5001, 65535, nil, []byte("payload")), 0)
	f.Add(h.frame(header.TCPFlagACK|header.TCPFlagFIN, 1001, 5001, 100, nil, nil), 3)
	f.Add(h.frame(header.TCPFlagRST, 1001, 0, 0, nil, nil), 0)
	f.Add(h.frame(header.TCPFlagACK, 3001, 5001, 65535, nil, []byte("past a hole")), 20) // kept (SACK)
	h.guest = netip.MustParseAddrPort("[fd00::15]:40000")
	h.remote = netip.MustParseAddrPort("[fd00::2]:80")
	f.Add(h.frame(header.TCPFlagSYN, 7, 0, 65535, ob[:n], nil), 10)

	f.Fuzz(func(t *testing.T, frame []byte, split int) {
		tab := New(Config{MaxFlows: 4, OurMAC: guestframe.OurMAC, Policy: addrpolicy.New(tcpHarnessPolicy), Logger: testenv.Logger()}, nil, nil)
		tab.dial = func(netip.AddrPort, int, int) (int, bool, error) { return -1, false, unix.ECONNREFUSED }
		// An established connection without a socket, matching the seeds.
		for _, k := range []struct{ g, r string }{{"10.0.2.15:40000", "10.0.2.2:80"}, {"[fd00::15]:40000", "[fd00::2]:80"}} {
			g, r := netip.MustParseAddrPort(k.g), netip.MustParseAddrPort(k.r)
			fl := tab.alloc(connKey{guestAddr: g.Addr().As16(), remoteAddr: r.Addr().As16(),
				guestPort: g.Port(), remotePort: r.Port(), v6: g.Addr().Is6()})
			fl.guestAddr, fl.remoteAddr, fl.guestPort, fl.remotePort = g.Addr(), r.Addr(), g.Port(), r.Port()
			fl.flags |= flConnected
			fl.iss, fl.seqToGuest, fl.sndMax, fl.seqAckFromGuest = 5000, 5001, 5001, 5001
			fl.seqInitFromGuest, fl.seqFromGuest, fl.seqAckToGuest = 1000, 1001, 1001
			fl.mssToGuest, fl.wndFromGuest = 1400, 65535
			fl.guestSACK = g.Addr().Is4() // data past a hole is kept on one of them
			tab.setState(fl, stats.TCPEstablished)
		}
		head := frame[:min(len(frame), 256)]
		// The frame in "guest memory", split in two iovecs at split.
		mem := append(make([]byte, virtqueue.NetHdrLen), frame...)
		s := virtqueue.NetHdrLen + min(max(split, 0), len(frame))
		iov := [][]byte{mem[:s], mem[s:]}
		now := time.Unix(1000, 0)
		w := tcpNewFakeWriter(8)
		for i := 0; i < 3; i++ {
			var p header.Packet
			if header.ParseFrame(head, len(frame), &p) == nil {
				tab.HandleGuestFrame(now, &p, iov, virtqueue.NetHdrLen)
			}
			tab.Flush(now, w)
			w.take()
			w.free = 8
			now = now.Add(time.Hour)
			tab.Timers(now)
			tab.Flush(now, w)
			w.take()
		}
		if len(tab.active)+len(tab.free) > tab.cfg.MaxFlows {
			t.Fatalf("slots: %d active + %d free > %d", len(tab.active), len(tab.free), tab.cfg.MaxFlows)
		}
		if len(w.pending) != 0 {
			t.Fatalf("reservation left outstanding")
		}
	})
}

// FuzzTCPParseFrame checks the parser alone: any claimed length must stay
// within the copy and the frame.
func FuzzTCPParseFrame(f *testing.F) {
	h := &tcpHarness{
		guest:    netip.MustParseAddrPort("10.0.2.15:40000"),
		remote:   netip.MustParseAddrPort("10.0.2.2:80"),
		guestMAC: [6]byte{1, 2, 3, 4, 5, 6},
	}
	f.Add(h.frame(header.TCPFlagACK, 1, 2, 3, nil, []byte("abc")), 0)
	f.Fuzz(func(t *testing.T, frame []byte, extra int) {
		frameLen := len(frame) + min(max(extra, 0), 1<<16)
		var p header.Packet
		var sg segment
		if header.ParseFrame(frame, frameLen, &p) != nil || !segmentFrom(&p, &sg) {
			return
		}
		if sg.payloadOff < 0 || sg.payloadLen < 0 || sg.payloadOff+sg.payloadLen > frameLen {
			t.Fatalf("payload %d+%d outside frame of %d", sg.payloadOff, sg.payloadLen, frameLen)
		}
	})
}

package tcp

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
	"vunet/virtqueue"
)

// TestTCPGuestMSSAndMTU: frames to the guest carry at most the guest's MSS,
// and never more than the MTU allows.
func TestTCPGuestMSSAndMTU(t *testing.T) {
	for _, tc := range []struct {
		mss, want int
	}{{500, 500}, {9000, 1460}} {
		h := tcpNewHarness(t, Config{MTU: 1500})
		ln := h.listen()
		peer := h.establish(ln, header.TCPOptions{HasMSS: true, MSS: uint16(tc.mss)})
		data := guestframe.Pattern(10 * tc.want)
		peer.Write(data)
		got := h.collect("data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(data) })
		for _, s := range got {
			if len(s.payload) > tc.want {
				t.Fatalf("guest MSS %d: frame with %d bytes", tc.mss, len(s.payload))
			}
			if s.vh.GSOType != virtqueue.GSONone {
				t.Fatalf("GSO without offload")
			}
		}
		if len(got[0].payload) != tc.want {
			t.Fatalf("guest MSS %d: first frame %d bytes, want %d", tc.mss, len(got[0].payload), tc.want)
		}
		if !bytes.Equal(tcpPayloadOf(got), data) {
			t.Fatalf("payload mismatch")
		}
	}
}

// TestTCPGSOFrames: with the guest's checksum and TSO offloads, frames grow
// to 64 KiB with GSO fields describing the segmentation, and carry a partial
// checksum the guest completes.
func TestTCPGSOFrames(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	h.tab.SetFeatures(true, true, true)
	ln := h.listen()
	peer := h.establish(ln, header.TCPOptions{HasMSS: true, MSS: 1460, HasWindowScale: true, WindowScale: 7})
	data := guestframe.Pattern(200000)
	go peer.Write(data)
	got := h.collect("data", func(s []tcpSeg) bool {
		if len(s) > 0 {
			h.ackAll(s[len(s)-1:])
		}
		return len(tcpPayloadOf(s)) >= len(data)
	})
	if !bytes.Equal(tcpPayloadOf(got), data) {
		t.Fatalf("payload mismatch")
	}
	big := 0
	for _, s := range got {
		if len(s.payload) == 0 {
			continue
		}
		if s.vh.Flags != virtqueue.NetHdrFNeedsCsum || s.vh.CsumStart != 34 || s.vh.CsumOffset != 16 {
			t.Fatalf("checksum fields %+v", s.vh)
		}
		if len(s.payload) > 1460 {
			big++
			if s.vh.GSOType != virtqueue.GSOTCPv4 || s.vh.GSOSize != 1460 || s.vh.HdrLen != 54 {
				t.Fatalf("GSO fields %+v for %d bytes", s.vh, len(s.payload))
			}
			if len(s.payload) > 65535-40 {
				t.Fatalf("GSO frame of %d bytes", len(s.payload))
			}
		} else if s.vh.GSOType != virtqueue.GSONone {
			t.Fatalf("GSO type on a frame within the MSS")
		}
	}
	if big == 0 {
		t.Fatalf("no GSO frame")
	}
}

// TestTCPChecksumAcrossIovecs: full TCP checksums are right when the guest
// buffers split the payload at odd offsets (merged RX buffers).
func TestTCPChecksumAcrossIovecs(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	h.w.chunk = 333
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	data := guestframe.Pattern(4321)
	peer.Write(data)
	got := h.collect("data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(data) })
	if !bytes.Equal(tcpPayloadOf(got), data) {
		t.Fatalf("payload mismatch")
	}
	for _, s := range got {
		if !s.csumOK {
			t.Fatalf("bad checksum")
		}
	}
}

// TestTCPIPv6: a guest IPv6 connection to the gateway reaches ::1.
func TestTCPIPv6(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	ln, err := net.ListenTCP("tcp6", &net.TCPAddr{IP: net.IPv6loopback})
	if err != nil {
		testenv.Unavailable(t, err, "IPv6 on the loopback interface (sysctl -w net.ipv6.conf.lo.disable_ipv6=0)")
	}
	defer ln.Close()
	h.guest = netip.MustParseAddrPort("[fd00::15]:40000")
	h.remote = netip.AddrPortFrom(netip.MustParseAddr("fd00::2"), uint16(ln.Addr().(*net.TCPAddr).Port))
	peer := h.establish(ln, tcpMss1400ws7)
	peer.Write([]byte("over v6"))
	got := h.collect("data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= 7 })
	if string(tcpPayloadOf(got)) != "over v6" || got[0].src != h.remote || got[0].dst != h.guest {
		t.Fatalf("got %q from %v to %v", tcpPayloadOf(got), got[0].src, got[0].dst)
	}
	h.sendAck([]byte("back"))
	if b := tcpReadN(t, peer, 4); string(b) != "back" {
		t.Fatalf("peer got %q", b)
	}
}

// TestTCPTableFull: a SYN beyond MaxFlows is refused and counted.
func TestTCPTableFull(t *testing.T) {
	h := tcpNewHarness(t, Config{MaxFlows: 1})
	ln := h.listen()
	h.establish(ln, tcpMss1400ws7)
	h.guest = netip.MustParseAddrPort("10.0.2.15:40001")
	h.sendSYN(tcpMss1400ws7)
	if h.tab.Len() != 1 || h.stats.ConnectFailures[stats.TCPTableFull].Load() != 1 {
		t.Fatalf("len %d tableFull %d", h.tab.Len(), h.stats.ConnectFailures[stats.TCPTableFull].Load())
	}
	// The established flow may announce its grown window in the same pass;
	// the refused port gets exactly one RST.
	var got []tcpSeg
	for _, s := range h.flush() {
		if s.dst == h.guest {
			got = append(got, s)
		}
	}
	if len(got) != 1 || got[0].flags != header.TCPFlagRST|header.TCPFlagACK || got[0].ack != h.isn+1 {
		t.Fatalf("refused SYN not reset: %+v", got)
	}
}

// TestTCPTableFullFlood: a TX batch's worth of SYNs (64) at a full table,
// handled before the output pass runs, each get their RST.
func TestTCPTableFullFlood(t *testing.T) {
	h := tcpNewHarness(t, Config{MaxFlows: 1})
	ln := h.listen()
	h.establish(ln, tcpMss1400ws7)
	h.flush()
	const n = 64
	for i := range n {
		h.guest = netip.AddrPortFrom(h.guest.Addr(), uint16(41000+i))
		h.sendSYN(tcpMss1400ws7)
	}
	rsts := 0
	for _, s := range h.flush() {
		if s.flags == header.TCPFlagRST|header.TCPFlagACK && s.dst.Port() >= 41000 {
			rsts++
		}
	}
	if rsts != n || h.stats.ConnectFailures[stats.TCPTableFull].Load() != n {
		t.Fatalf("%d SYNs refused (table full %d), %d RSTs to the guest", n, h.stats.ConnectFailures[stats.TCPTableFull].Load(), rsts)
	}
}

// TestTCPUnknownSegmentReset: a segment for no known connection gets an RST
// (seq from its ACK), queued behind nothing and bounded in number.
func TestTCPUnknownSegmentReset(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	h.remote = netip.MustParseAddrPort("10.0.2.2:12345")
	h.w.free = 0
	const extra = 24
	for i := 0; i < rstQueueLen+extra; i++ {
		h.inject(h.frame(header.TCPFlagACK, 100, 5000+uint32(i), 1000, nil, []byte("stale")))
	}
	if d := h.qstats.RX.Drops[stats.DropPendingOverflow].Load(); d != extra {
		t.Fatalf("%d resets past the queue counted as dropped, want %d", d, extra)
	}
	if got := h.flush(); len(got) != 0 || !h.blocked {
		t.Fatalf("sent without buffers")
	}
	h.w.free = 100
	got := h.flush()
	if len(got) != rstQueueLen {
		t.Fatalf("want %d RSTs (queue bound), got %d", rstQueueLen, len(got))
	}
	if s := got[0]; s.flags != header.TCPFlagRST || s.seq != 5000 || s.src != h.remote || s.dst != h.guest {
		t.Fatalf("bad RST %+v", s)
	}
	// An RST is never answered.
	h.inject(h.frame(header.TCPFlagRST, 100, 0, 0, nil, nil))
	if got := h.flush(); len(got) != 0 {
		t.Fatalf("RST answered")
	}
	if h.stats.RSTSent.Load() != rstQueueLen || h.tab.Len() != 0 {
		t.Fatalf("rst sent %d", h.stats.RSTSent.Load())
	}
}

package tcp

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/internal/guestframe"
)

// tcpKernelV4PeekOffOnly makes h's table meet a kernel whose TCPv4
// sockets take SO_PEEK_OFF and whose TCPv6 sockets refuse it with
// EOPNOTSUPP (Linux 6.10, before the IPv6 fix). probeV6 is what the
// table's AF_INET6 probe found: false as on such a kernel; true plays a
// probe that could not see it (today's main probed AF_INET only). It
// returns a counter of SO_PEEK_OFF attempts on IPv6 sockets.
func tcpKernelV4PeekOffOnly(h *tcpHarness, probeV6 bool) *int {
	h.t.Helper()
	if !hostsock.PeekOffsetSupported(false) {
		h.t.Skip("kernel without SO_PEEK_OFF for TCP: nothing to tell apart per family")
	}
	v6Tries := new(int)
	h.tab.peekOff = [2]bool{true, probeV6}
	h.tab.setPeekOff = func(fd, off int) error {
		if hostsock.SocketIsIPv6(fd) {
			*v6Tries++
			return unix.EOPNOTSUPP
		}
		return hostsock.SetPeekOffset(fd, off)
	}
	return v6Tries
}

// tcpGuest6 makes the harness guest fd00::15, its peer the gateway
// fd00::2 (mapped to ::1), and tells the table.
func (h *tcpHarness) tcpGuest6() {
	h.guest = netip.MustParseAddrPort("[fd00::15]:40000")
	h.tab.SetGuest(h.guestMAC, netip.Addr{}, h.guest.Addr())
}

// listen6 is listen on ::1, reached through fd00::2.
func (h *tcpHarness) listen6() *net.TCPListener {
	h.t.Helper()
	ln, err := net.ListenTCP("tcp6", &net.TCPAddr{IP: net.IPv6loopback})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { ln.Close() })
	h.remote = netip.AddrPortFrom(netip.MustParseAddr("fd00::2"), uint16(ln.Addr().(*net.TCPAddr).Port))
	return ln
}

// tcpHostToGuestWithRewind has peer send n bytes to the guest, which
// acknowledges half of what it got, asks for the rest again with two
// duplicate ACKs, then acknowledges as it goes. Every byte the guest sees,
// first copy or retransmission, must be the peer's byte at its sequence.
func tcpHostToGuestWithRewind(h *tcpHarness, peer net.Conn, n int) {
	h.t.Helper()
	f := h.flow()
	base := f.seqToGuest
	data := guestframe.Pattern(n)
	go func() {
		peer.SetWriteDeadline(time.Now().Add(10 * time.Second))
		peer.Write(data)
	}()
	got := make([]byte, 0, n)
	rewound := false
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < n {
		if time.Now().After(deadline) {
			q, _ := unix.IoctlGetInt(f.fd, unix.SIOCINQ)
			h.t.Fatalf("got %d of %d bytes (flow state %v, RSTs %d; in flight %d, guest window %d, queued %d, drained %v, flags %#x, epoll %#x, ack %d)",
				len(got), n, f.state, h.stats.RSTSent.Load(), f.inFlight(), f.wndFromGuest, q, f.drained, f.flags, f.epollEvents, h.ack-base)
		}
		segs := h.pump(10 * time.Millisecond)
		for _, s := range segs {
			if s.flags.Has(header.TCPFlagRST) {
				h.t.Fatalf("connection reset after %d bytes", len(got))
			}
			off := int(s.seq - base)
			if len(s.payload) == 0 {
				continue
			}
			if off < 0 || off+len(s.payload) > n {
				h.t.Fatalf("segment at %d+%d outside the data", off, len(s.payload))
			}
			if !bytes.Equal(s.payload, data[off:off+len(s.payload)]) {
				h.t.Fatalf("bytes at %d differ from what the peer sent", off)
			}
			if off+len(s.payload) > len(got) {
				got = data[:off+len(s.payload)]
			}
		}
		if len(got) == 0 || h.ack == base+uint32(len(got)) {
			continue
		}
		if !rewound && len(got) > 2000 {
			rewound = true
			h.ack = base + uint32(len(got)/2)
			h.sendAck(nil)
			h.sendAck(nil)
			h.sendAck(nil)
			re := h.flush()
			if len(re) == 0 || re[0].seq != h.ack {
				h.t.Fatalf("no retransmission from the guest's ACK")
			}
			for _, s := range re {
				off := int(s.seq - base)
				if off+len(s.payload) > n || !bytes.Equal(s.payload, data[off:off+len(s.payload)]) {
					h.t.Fatalf("retransmitted bytes at %d differ", off)
				}
				// The pass that resends may go on past what was sent
				// before, with data the peer wrote since: the guest has
				// that too, and waits for nothing more until it ACKs it.
				if off+len(s.payload) > len(got) {
					got = data[:off+len(s.payload)]
				}
			}
			continue
		}
		h.ack = base + uint32(len(got))
		h.sendAck(nil)
	}
	if !rewound {
		h.t.Fatalf("transfer too short to rewind")
	}
}

// tcpGuestToHost sends n bytes from the guest to peer and checks them.
func tcpGuestToHost(h *tcpHarness, peer net.Conn, n int) {
	h.t.Helper()
	data := guestframe.Pattern(n)
	for off := 0; off < n; off += 1000 {
		h.sendAck(data[off:min(off+1000, n)])
	}
	h.flush()
	if b := tcpReadN(h.t.(*testing.T), peer, n); !bytes.Equal(b, data) {
		h.t.Fatalf("peer got different bytes")
	}
}

// TestTCPPeekOffsetPerFamily: on a kernel where TCPv4 sockets take
// SO_PEEK_OFF and TCPv6 ones do not, IPv6 connections (made by the guest,
// and forwarded to it) run on the discard-buffer fallback and carry data
// byte-exact both ways, retransmissions included, while IPv4 connections
// keep the peek offset. With the AF_INET6 probe failing, no IPv6 socket
// is even asked; with a probe that said yes, the refusal costs the
// connection nothing.
func TestTCPPeekOffsetPerFamily(t *testing.T) {
	for _, probeV6 := range []bool{false, true} {
		name := "v6 probe fails"
		if probeV6 {
			name = "v6 probe passes, sockets refuse"
		}
		t.Run(name, func(t *testing.T) {
			t.Run("outbound v6", func(t *testing.T) {
				h := tcpNewHarness(t, Config{MTU: 1500})
				tries := tcpKernelV4PeekOffOnly(h, probeV6)
				h.tcpGuest6()
				ln := h.listen6()
				peer := h.establish(ln, tcpMss1400ws7)
				if f := h.flow(); f.peekOff {
					t.Fatalf("IPv6 connection reads at SO_PEEK_OFF")
				}
				if probeV6 != (*tries > 0) {
					t.Fatalf("SO_PEEK_OFF asked of IPv6 sockets %d times with the probe at %v", *tries, probeV6)
				}
				tcpHostToGuestWithRewind(h, peer, 200_000)
				tcpGuestToHost(h, peer, 50_000)
			})
			t.Run("inbound forward v6", func(t *testing.T) {
				h := tcpNewHarness(t, Config{MTU: 1500})
				tcpKernelV4PeekOffOnly(h, probeV6)
				h.tcpGuest6()
				_, port, err := h.tab.Listen(netip.MustParseAddrPort("[::1]:0"), "", 8080)
				if err != nil {
					t.Fatal(err)
				}
				c, err := net.Dial("tcp6", netip.AddrPortFrom(netip.IPv6Loopback(), port).String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				syn := h.answerForwardSyn(8080)
				h.seq, h.ack = h.isn+1, syn.seq+1
				var ob [40]byte
				n := header.EncodeTCPOptions(ob[:], &tcpMss1400ws7)
				h.inject(h.frame(header.TCPFlagSYN|header.TCPFlagACK, h.isn, h.ack, 65535, ob[:n], nil))
				h.ws = tcpMss1400ws7.WindowScale
				h.flush()
				f := h.flow()
				if f == nil || f.peekOff {
					t.Fatalf("forwarded IPv6 connection not established on the fallback")
				}
				tcpHostToGuestWithRewind(h, c, 200_000)
				tcpGuestToHost(h, c, 50_000)
			})
			t.Run("outbound v4 keeps the peek offset", func(t *testing.T) {
				h := tcpNewHarness(t, Config{MTU: 1500})
				tcpKernelV4PeekOffOnly(h, probeV6)
				ln := h.listen()
				peer := h.establish(ln, tcpMss1400ws7)
				if !h.flow().peekOff {
					t.Fatalf("IPv4 connection on the fallback")
				}
				tcpHostToGuestWithRewind(h, peer, 200_000)
				tcpGuestToHost(h, peer, 50_000)
			})
		})
	}
}

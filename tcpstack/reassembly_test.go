package tcpstack

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
	"vunet/virtqueue"
)

// udpDatagram is a whole UDP datagram (header and payload) from src to
// dst:port with a valid checksum.
func udpDatagram(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	return guestframe.UDP(src, dst, sport, dport, payload)
}

// fragPiece is one fragment: L4 bytes [off, off+len(data)) of a datagram.
type fragPiece struct {
	off  int
	data []byte
	more bool
}

// fragFrame builds a guest frame carrying one fragment.
func fragFrame(src, dst netip.Addr, proto uint8, id uint32, p fragPiece) []byte {
	f := make([]byte, header.EthernetMinimumSize)
	if src.Is4() {
		header.EncodeEthernet(f, header.MAC(linksvc.DefaultOurMAC), header.MAC(testGuestMAC), header.EtherTypeIPv4)
		ip := make([]byte, header.IPv4MinimumSize)
		header.EncodeIPv4(ip, &header.IPv4Fields{TotalLength: uint16(header.IPv4MinimumSize + len(p.data)), ID: uint16(id), TTL: 64,
			Protocol: header.IPProtocol(proto), Source: src, Destination: dst})
		ff := uint16(p.off / 8)
		if p.more {
			ff |= 0x2000
		}
		binary.BigEndian.PutUint16(ip[6:8], ff)
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:12], ^header.Checksum(ip, 0))
		f = append(f, ip...)
	} else {
		header.EncodeEthernet(f, header.MAC(linksvc.DefaultOurMAC), header.MAC(testGuestMAC), header.EtherTypeIPv6)
		ip := make([]byte, header.IPv6MinimumSize+8)
		header.EncodeIPv6(ip, &header.IPv6Fields{PayloadLength: uint16(8 + len(p.data)), NextHeader: header.IPProtocolFragment,
			HopLimit: 64, Source: src, Destination: dst})
		fh := ip[header.IPv6MinimumSize:]
		fh[0] = proto
		ofm := uint16(p.off/8) << 3
		if p.more {
			ofm |= 1
		}
		binary.BigEndian.PutUint16(fh[2:4], ofm)
		binary.BigEndian.PutUint32(fh[4:8], id)
		f = append(f, ip...)
	}
	return append(f, p.data...)
}

// split cuts b into fragments of at most size bytes (a multiple of 8).
func split(b []byte, size int) []fragPiece {
	var out []fragPiece
	for off := 0; off < len(b); off += size {
		end := min(off+size, len(b))
		out = append(out, fragPiece{off: off, data: b[off:end], more: end < len(b)})
	}
	return out
}

// fragLoop is a pair's loop, not running, that the test drives frame by
// frame through the TX handlers at a time it chooses.
type fragLoop struct {
	t     *testing.T
	l     *loop
	chain virtqueue.Chain
}

func newFragLoop(t *testing.T) *fragLoop {
	p := newFlowPair(t, featModern, nil)
	l := benchLoop(t, p)
	l.now = time.Unix(1_000_000, 0)
	return &fragLoop{t: t, l: l}
}

// send hands one frame to the TX path as a chain would.
func (f *fragLoop) send(frame []byte) {
	vh := f.l.vhLen
	b := append(make([]byte, vh), frame...)
	f.chain.Readable = [][]byte{b}
	f.l.handleTXFrame(&f.chain)
	f.l.flushSends() // as txBatch does before it publishes the chains
}

func (f *fragLoop) outcomes() map[stats.FragOutcome]uint64 {
	m := map[stats.FragOutcome]uint64{}
	for o := stats.FragOutcome(0); o < stats.NumFragOutcomes; o++ {
		if n := f.l.st.Proto.Fragments[o].Load(); n > 0 {
			m[o] = n
		}
	}
	return m
}

// TestReassemblyDelivers: fragmented UDP datagrams, in and out of order,
// IPv4 and IPv6, reach the host socket whole and byte for byte.
func TestReassemblyDelivers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		v6    bool
		size  int
		frag  int
		order []int // fragment order; nil = as cut
	}{
		{"v4_in_order", false, 3000, 1480, nil},
		{"v4_reversed", false, 3000, 1480, []int{2, 1, 0}},
		{"v4_max", false, 65535 - 20 - 8, 1480, nil},
		{"v6_shuffled", true, 5000, 1232, []int{3, 0, 4, 2, 1}},
		{"v6_atomic", true, 100, 1232, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			network, laddr, src, dst := "udp4", "127.0.0.1:0", testGuest4, testGw4
			if tc.v6 {
				network, laddr, src, dst = "udp6", "[::1]:0", testGuest6, testGw6
			}
			c, err := net.ListenPacket(network, laddr)
			if err != nil {
				testenv.Unavailable(t, err, "loopback addresses for IPv4 and IPv6 ("+"IPv6 on the loopback interface (sysctl -w net.ipv6.conf.lo.disable_ipv6=0)"+")")
			}
			defer c.Close()
			port := uint16(c.LocalAddr().(*net.UDPAddr).Port)
			payload := make([]byte, tc.size)
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			pieces := split(udpDatagram(src, dst, 40000, port, payload), tc.frag)
			order := tc.order
			if order == nil {
				for i := range pieces {
					order = append(order, i)
				}
			}
			f := newFragLoop(t)
			for _, i := range order {
				f.send(fragFrame(src, dst, uint8(header.IPProtocolUDP), 0xbeef, pieces[i]))
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 70000)
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf[:n], payload) {
				t.Fatalf("host got %d bytes, want %d (equal prefix: %v)", n, len(payload), bytes.HasPrefix(payload, buf[:min(n, 64)]))
			}
			want := map[stats.FragOutcome]uint64{stats.FragReceived: uint64(len(pieces)), stats.FragReassembled: 1}
			if got := f.outcomes(); !equalOutcomes(got, want) {
				t.Errorf("outcomes %v, want %v", got, want)
			}
			if d := f.l.st.TX.Drops[stats.DropFragment].Load(); d != 0 {
				t.Errorf("fragment drops %d", d)
			}
			for _, b := range f.l.frag.bufs {
				if b.inUse {
					t.Errorf("buffer still in use")
				}
			}
		})
	}
}

func equalOutcomes(a, b map[stats.FragOutcome]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestReassemblyRejects: overlapping and duplicate fragments, oversize
// datagrams, inconsistent lengths and TCP fragments are dropped and
// counted; timeouts and a full pool free buffers.
func TestReassemblyRejects(t *testing.T) {
	src, dst := testGuest4, testGw4
	data := make([]byte, 4000)
	for _, tc := range []struct {
		name      string
		steps     []fragStep
		want      map[stats.FragOutcome]uint64
		wantDrops uint64
	}{
		{"overlap", steps(0, 1, uint8(header.IPProtocolUDP), fragPiece{0, data[:1480], true}, fragPiece{8, data[8:1488], true}),
			map[stats.FragOutcome]uint64{stats.FragReceived: 1, stats.FragOverlap: 1}, 1},
		{"duplicate", steps(0, 1, uint8(header.IPProtocolUDP), fragPiece{0, data[:1480], true}, fragPiece{0, data[:1480], true}),
			map[stats.FragOutcome]uint64{stats.FragReceived: 1, stats.FragOverlap: 1}, 1},
		{"over_65535", steps(0, 1, uint8(header.IPProtocolUDP), fragPiece{65512, data[:16], false}),
			map[stats.FragOutcome]uint64{stats.FragInvalid: 1}, 1},
		{"odd_middle", steps(0, 1, uint8(header.IPProtocolUDP), fragPiece{0, data[:1001], true}),
			map[stats.FragOutcome]uint64{stats.FragInvalid: 1}, 1},
		{"beyond_last", steps(0, 1, uint8(header.IPProtocolUDP), fragPiece{1480, data[:100], false}, fragPiece{1576, data[:16], true}),
			map[stats.FragOutcome]uint64{stats.FragReceived: 1, stats.FragInvalid: 1}, 1},
		{"tcp", steps(0, 1, uint8(header.IPProtocolTCP), fragPiece{0, data[:1480], true}),
			map[stats.FragOutcome]uint64{stats.FragUnsupported: 1}, 1},
		{"timeout", append(steps(0, 1, uint8(header.IPProtocolUDP), fragPiece{0, data[:1480], true}),
			steps(31*time.Second, 1, uint8(header.IPProtocolUDP), fragPiece{1480, data[:100], false})...),
			map[stats.FragOutcome]uint64{stats.FragReceived: 2, stats.FragTimeout: 1}, 1},
		{"pool_full", steps(0, 0, uint8(header.IPProtocolUDP), fragPiece{0, data[:1480], true}, fragPiece{0, data[:1480], true},
			fragPiece{0, data[:1480], true}, fragPiece{0, data[:1480], true}, fragPiece{0, data[:1480], true}),
			map[stats.FragOutcome]uint64{stats.FragReceived: 5, stats.FragEvicted: 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFragLoop(t)
			start := f.l.now
			for _, s := range tc.steps {
				f.l.now = start.Add(s.after)
				f.send(fragFrame(src, dst, s.proto, s.id, s.p))
			}
			if got := f.outcomes(); !equalOutcomes(got, tc.want) {
				t.Errorf("outcomes %v, want %v", got, tc.want)
			}
			if d := f.l.st.TX.Drops[stats.DropFragment].Load(); d != tc.wantDrops {
				t.Errorf("fragment drops %d, want %d", d, tc.wantDrops)
			}
			if n := dgramOpened(f.l.st); n != 0 {
				t.Errorf("%d flows opened for an incomplete datagram", n)
			}
		})
	}
}

// fragStep sends fragment p of datagram id at start+after.
type fragStep struct {
	after time.Duration
	id    uint32
	proto uint8
	p     fragPiece
}

// steps builds fragment steps at one time; id 0 means a new id per step.
func steps(after time.Duration, id uint32, proto uint8, ps ...fragPiece) []fragStep {
	var out []fragStep
	for i, p := range ps {
		sid := id
		if sid == 0 {
			sid = uint32(100 + i)
		}
		out = append(out, struct {
			after time.Duration
			id    uint32
			proto uint8
			p     fragPiece
		}{after, sid, proto, p})
	}
	return out
}

// BenchmarkReassembleUDP: a 3000-byte datagram in three fragments,
// reassembled and sent: 0 allocs/op.
func BenchmarkReassembleUDP(b *testing.B) {
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		testenv.Unavailable(b, err, "a loopback interface with 127.0.0.1")
	}
	defer c.Close()
	go func() {
		// ReadFromUDPAddrPort, unlike ReadFrom, allocates nothing: this
		// goroutine's allocations would count against the data path's.
		uc := c.(*net.UDPConn)
		buf := make([]byte, 70000)
		for {
			if _, _, err := uc.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
		}
	}()
	port := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	p := newFlowPair(b, featModern, nil)
	l := benchLoop(b, p)
	l.now = time.Now()
	var frames [][]byte
	for _, pc := range split(udpDatagram(testGuest4, testGw4, 40000, port, make([]byte, 3000)), 1480) {
		frames = append(frames, append(make([]byte, l.vhLen), fragFrame(testGuest4, testGw4, uint8(header.IPProtocolUDP), 7, pc)...))
	}
	var chain virtqueue.Chain
	iov := make([][]byte, 1)
	b.ReportAllocs()
	b.SetBytes(3000)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, fr := range frames {
			iov[0] = fr
			chain.Readable = iov
			l.handleTXFrame(&chain)
		}
	}
	b.StopTimer()
	if got := l.st.Proto.Fragments[stats.FragReassembled].Load(); got != uint64(b.N) {
		b.Fatalf("reassembled %d, want %d", got, b.N)
	}
}

// TestICMPEchoFragmented: a guest ping larger than its MTU, fragmented,
// is reassembled into one echo request; the whole reply comes back. It
// runs in a private network namespace, where ping sockets can be allowed.
func TestICMPEchoFragmented(t *testing.T) {
	if !testenv.InPrivateNetns(t, testenv.PingAllowed) {
		return
	}
	for _, v6 := range []bool{false, true} {
		p := newFlowPair(t, featMrg, nil)
		p.postRX(16, 1536)
		p.start()
		src, gw, proto := testGuest4, testGw4, uint8(uint8(header.IPProtocolICMPv4))
		if v6 {
			src, gw, proto = testGuest6, testGw6, uint8(header.IPProtocolICMPv6)
		}
		payload := make([]byte, 3000)
		for i := range payload {
			payload[i] = byte(i)
		}
		full := icmpEchoFrame(src, gw, 0x4242, 9, payload)
		l3 := header.IPv4MinimumSize
		if v6 {
			l3 = header.IPv6MinimumSize
		}
		msg := full[header.EthernetMinimumSize+l3:]
		for _, pc := range split(msg, 1232) {
			p.addTX(fragFrame(src, gw, proto, 77, pc))
		}
		p.tx.Send()
		waitFor(t, "echo reply", 3*time.Second, func() bool { return p.rxFrames(1) == 1 })
		p.s.StopPair(0)
		_, frames := p.rxReadIP(t)
		reply := frames[0][header.EthernetMinimumSize+l3:]
		if len(reply) != header.ICMPMinimumSize+len(payload) || !bytes.Equal(reply[header.ICMPMinimumSize:], payload) ||
			binary.BigEndian.Uint16(reply[4:6]) != 0x4242 {
			t.Errorf("v6=%v: reply of %d bytes, id %#x", v6, len(reply), binary.BigEndian.Uint16(reply[4:6]))
		}
		if got := p.stats().Proto.Fragments[stats.FragReassembled].Load(); got != 1 {
			t.Errorf("v6=%v: reassembled %d", v6, got)
		}
	}
}

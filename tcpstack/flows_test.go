package tcpstack

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
	"vunet/virtqueue"
)

var (
	testGw4     = netip.AddrFrom4(testGwIP)
	testGuest4  = netip.AddrFrom4(testGuestIP)
	testGw6     = netip.MustParseAddr("fe80::1")
	testGuest6  = netip.MustParseAddr("fd00::15")
	testFeatCsm = uint64(1 << virtqueue.FeatureNetGuestCsum)
)

// newFlowPair is newTestPair with a gateway configured for flows.
func newFlowPair(t testing.TB, features uint64, mod func(*Config)) *testPair {
	t.Helper()
	p := newTestPair(t, features, 256)
	cfg := Config{Logger: testenv.Logger()}
	cfg.Addr.IPv4.Addr = testGuest4
	cfg.Addr.IPv4.PrefixLen = 24
	cfg.Addr.IPv4.Gateway = testGw4
	cfg.Addr.IPv6.GatewayLL = testGw6
	// The guest's IPv6 prefix, so its fd00::15 is its own to the address
	// policy; without periodic RAs, which these tests do not count.
	cfg.Addr.IPv6.Addr = testGuest6
	cfg.Addr.IPv6.PrefixLen = 64
	cfg.Addr.NoRA = true
	if mod != nil {
		mod(&cfg)
	}
	p.s = New(cfg)
	p.announced = 1 // the gratuitous ARP for the gateway at every pair start
	t.Cleanup(p.s.Close)
	return p
}

// rxReadIP is rxRead without the link announcements (ARP frames).
func (p *testPair) rxReadIP(t *testing.T) (hdrs []virtqueue.NetHdr, frames [][]byte) {
	t.Helper()
	h, f := p.rxRead(t)
	for i := range f {
		if binary.BigEndian.Uint16(f[i][12:14]) == uint16(header.EtherTypeARP) {
			continue
		}
		hdrs, frames = append(hdrs, h[i]), append(frames, f[i])
	}
	return hdrs, frames
}

// rxFrames is the RX frame count less the announcements of n pair starts.
func (p *testPair) rxFrames(starts int) uint64 {
	return p.stats().RX.Frames.Load() - uint64(starts*p.announced)
}

// udpFrame builds a guest UDP frame from the guest to dst.
func udpFrame(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	return guestIPFrame(src, dst, header.IPProtocolUDP, udpDatagram(src, dst, sport, dport, payload))
}

// guestIPFrame wraps an L4 message in the IPv4 or IPv6 header that dst's
// family calls for and an Ethernet header from the guest to us.
func guestIPFrame(src, dst netip.Addr, proto header.IPProtocol, l4 []byte) []byte {
	return guestframe.Frame(guestframe.OurMAC, src, dst, proto, 64, l4)
}

// udpEcho listens on loopback and echoes every datagram back.
func udpEcho(t *testing.T, network, addr string) (port uint16) {
	t.Helper()
	c, err := net.ListenPacket(network, addr)
	if err != nil {
		testenv.Unavailable(t, fmt.Errorf("listen %s %s: %w", network, addr, err), "loopback addresses for IPv4 and IPv6 ("+"IPv6 on the loopback interface (sysctl -w net.ipv6.conf.lo.disable_ipv6=0)"+")")
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 70000)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			c.WriteTo(buf[:n], from)
		}
	}()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port)
}

// checkUDPFrame verifies a frame to the guest: addresses, ports, payload and
// checksums (completing a partial checksum as the guest would).
func checkUDPFrame(t *testing.T, vh virtqueue.NetHdr, frame []byte, src, dst netip.Addr, sport, dport uint16, payload []byte) {
	t.Helper()
	eth, err := header.ParseEthernet(frame)
	if err != nil {
		t.Fatal(err)
	}
	if eth.Destination() != header.MAC(testGuestMAC) || eth.Source() != header.MAC(linksvc.DefaultOurMAC) {
		t.Errorf("MACs %v -> %v", eth.Source(), eth.Destination())
	}
	var l4 []byte
	var gotSrc, gotDst netip.Addr
	if src.Is4() {
		ip, err := header.ParseIPv4(eth.Payload())
		if err != nil {
			t.Fatal(err)
		}
		if !ip.IsChecksumValid() || ip.Protocol() != header.IPProtocolUDP {
			t.Errorf("bad IPv4 header %x", []byte(ip[:20]))
		}
		gotSrc, gotDst, l4 = ip.Source(), ip.Destination(), ip.Payload()
	} else {
		ip, err := header.ParseIPv6(eth.Payload())
		if err != nil {
			t.Fatal(err)
		}
		gotSrc, gotDst, l4 = ip.Source(), ip.Destination(), ip.Payload()
	}
	if gotSrc != src || gotDst != dst {
		t.Errorf("addresses %v -> %v, want %v -> %v", gotSrc, gotDst, src, dst)
	}
	u, err := header.ParseUDP(l4)
	if err != nil {
		t.Fatal(err)
	}
	if u.SourcePort() != sport || u.DestinationPort() != dport || !bytes.Equal(u.Payload(), payload) {
		t.Errorf("UDP %d -> %d, %d bytes; want %d -> %d, %d bytes", u.SourcePort(), u.DestinationPort(),
			len(u.Payload()), sport, dport, len(payload))
	}
	if vh.Flags&virtqueue.NetHdrFNeedsCsum != 0 {
		// Complete the partial checksum like the guest's stack.
		start, off := int(vh.CsumStart), int(vh.CsumOffset)
		c := ^header.Checksum(frame[start:], 0)
		binary.BigEndian.PutUint16(frame[start+off:], c)
	}
	if !u.IsChecksumValid(src, dst) {
		t.Errorf("UDP checksum invalid (flags %#x)", vh.Flags)
	}
}

func TestUDPFlowEcho(t *testing.T) {
	for _, tc := range []struct {
		name   string
		feat   uint64
		v6     bool
		size   int
		rxBufs uint32
	}{
		{"v4", featModern, false, 5, 2048},
		{"v4_csum_offload", featModern | testFeatCsm, false, 100, 2048},
		{"v4_mrg_big", featMrg, false, 5000, 1536},
		{"v4_mrg_big_csum", featMrg | testFeatCsm, false, 9001, 1536},
		{"v6", featModern, true, 33, 2048},
		{"v6_mrg_big", featMrg, true, 7777, 1536},
		{"v4_legacy", featLegacy, false, 1200, 65562},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFlowPair(t, tc.feat, nil)
			var port uint16
			src, gw := testGuest4, testGw4
			if tc.v6 {
				port = udpEcho(t, "udp6", "[::1]:0")
				src, gw = testGuest6, testGw6
			} else {
				port = udpEcho(t, "udp4", "127.0.0.1:0")
			}
			p.postRX(16, tc.rxBufs)
			p.start()
			payload := bytes.Repeat([]byte("0123456789abcdef"), tc.size/16+1)[:tc.size]
			p.addTX(udpFrame(src, gw, 40000, port, payload))
			p.tx.Send()
			waitFor(t, "echo", 3*time.Second, func() bool { return p.rxFrames(1) == 1 })
			p.s.StopPair(0)
			hdrs, frames := p.rxReadIP(t)
			if len(frames) != 1 {
				t.Fatalf("%d frames", len(frames))
			}
			checkUDPFrame(t, hdrs[0], frames[0], gw, src, port, 40000, payload)
			st := p.stats()
			if dgramOpened(st) != 1 || st.TX.Drops[stats.DropSendError].Load() != 0 {
				t.Errorf("flows opened %d send errors %d", dgramOpened(st), st.TX.Drops[stats.DropSendError].Load())
			}
		})
	}
}

func TestUDPFlowWaitsForRXBuffers(t *testing.T) {
	p := newFlowPair(t, featMrg, nil)
	port := udpEcho(t, "udp4", "127.0.0.1:0")
	p.start()
	const n = 5
	for i := 0; i < n; i++ {
		p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte{byte(i)}))
	}
	p.tx.Send()
	waitFor(t, "TX sent", 2*time.Second, func() bool { return p.tx.UsedIdx() == n })
	time.Sleep(50 * time.Millisecond) // echoes are queued on the host socket
	if p.rxFrames(0) != 0 {
		t.Fatal("frames without buffers")
	}
	for i := 0; i < n+p.announced; i++ {
		p.rx.AddBuffers(nil, 1536)
	}
	p.rx.Send()
	waitFor(t, "echoes after refill", 2*time.Second, func() bool { return p.rxFrames(1) == n })
	p.s.StopPair(0)
	_, frames := p.rxReadIP(t)
	for i, f := range frames {
		if f[len(f)-1] != byte(i) {
			t.Errorf("frame %d payload %x", i, f[len(f)-1])
		}
	}
}

func TestUDPFlowSurvivesRestartAndExpires(t *testing.T) {
	p := newFlowPair(t, featModern, func(c *Config) { c.UDPTimeout = time.Second })
	port := udpEcho(t, "udp4", "127.0.0.1:0")
	p.postRX(8, 2048)
	p.start()
	p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte("a")))
	p.tx.Send()
	st := p.stats()
	waitFor(t, "echo 1", 2*time.Second, func() bool { return p.rxFrames(1) == 1 })
	p.restart()
	p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte("b")))
	p.tx.Send()
	waitFor(t, "echo 2", 2*time.Second, func() bool { return p.rxFrames(2) == 2 })
	if dgramOpened(st) != 1 {
		t.Errorf("flows opened %d, want 1 (flow kept across restart)", dgramOpened(st))
	}
	waitFor(t, "idle flow closed", 5*time.Second, func() bool { return dgramClosed(st) == 1 })
}

func TestUDPToMulticastDropped(t *testing.T) {
	p := newFlowPair(t, featModern, nil)
	p.start()
	p.addTX(udpFrame(testGuest4, netip.MustParseAddr("224.0.0.251"), 5353, 5353, []byte("mdns")))
	p.tx.Send()
	st := p.stats()
	waitFor(t, "drop", 2*time.Second, func() bool { return st.TX.Drops[stats.DropPolicy].Load() == 1 })
	if dgramOpened(st) != 0 {
		t.Error("flow opened for multicast")
	}
	if n := st.PolicyDrops[addrpolicy.UDP][addrpolicy.DstMulticast].Load(); n != 1 {
		t.Errorf("policy drops udp/dst_multicast = %d, want 1", n)
	}
}

// icmpEchoFrame builds a guest echo request.
func icmpEchoFrame(src, dst netip.Addr, id, seq uint16, payload []byte) []byte {
	m := make([]byte, header.ICMPMinimumSize+len(payload))
	copy(m[header.ICMPMinimumSize:], payload)
	if dst.Is4() {
		header.EncodeICMPv4Echo(m, header.ICMPv4EchoRequest, id, seq)
		header.ICMPv4(m).SetChecksum()
		return guestIPFrame(src, dst, header.IPProtocolICMPv4, m)
	}
	header.EncodeICMPv6Echo(m, header.ICMPv6EchoRequest, id, seq)
	header.ICMPv6(m).SetChecksum(src, dst)
	return guestIPFrame(src, dst, header.IPProtocolICMPv6, m)
}

// TestICMPEcho runs in a private network namespace, where ping sockets can
// be allowed without touching the host's sysctl.
func TestICMPEcho(t *testing.T) {
	if !testenv.InPrivateNetns(t, testenv.PingAllowed) {
		return
	}
	for _, v6 := range []bool{false, true} {
		p := newFlowPair(t, featModern, nil)
		p.postRX(8, 2048)
		p.start()
		src, gw := testGuest4, testGw4
		if v6 {
			src, gw = testGuest6, testGw6
		}
		payload := []byte("ping payload, odd length!")
		p.addTX(icmpEchoFrame(src, gw, 0x1234, 7, payload))
		p.tx.Send()
		st := p.stats()
		waitFor(t, "echo reply", 3*time.Second, func() bool { return p.rxFrames(1) == 1 })
		p.s.StopPair(0)
		_, frames := p.rxReadIP(t)
		eth, _ := header.ParseEthernet(frames[0])
		var msg []byte
		if !v6 {
			ip, err := header.ParseIPv4(eth.Payload())
			if err != nil || ip.Source() != gw || ip.Destination() != src || !ip.IsChecksumValid() {
				t.Fatalf("IPv4 %x %v", frames[0], err)
			}
			msg = ip.Payload()
			m := header.ICMPv4(msg)
			if m.Type() != header.ICMPv4EchoReply || m.Ident() != 0x1234 || m.Sequence() != 7 || !m.IsChecksumValid() {
				t.Errorf("reply %x", msg)
			}
		} else {
			ip, err := header.ParseIPv6(eth.Payload())
			if err != nil || ip.Source() != gw || ip.Destination() != src {
				t.Fatalf("IPv6 %x %v", frames[0], err)
			}
			msg = ip.Payload()
			m := header.ICMPv6(msg)
			if m.Type() != header.ICMPv6EchoReply || m.Ident() != 0x1234 || m.Sequence() != 7 || !m.IsChecksumValid(gw, src) {
				t.Errorf("reply %x", msg)
			}
		}
		if !bytes.Equal(msg[header.ICMPMinimumSize:], payload) {
			t.Errorf("payload %q", msg[header.ICMPMinimumSize:])
		}
		if st.ServiceReplies[stats.SvcICMPEcho].Load() != 1 || st.Proto.ICMPEchoRequests.Load() != 1 ||
			st.Proto.ICMPEchoReplies.Load() != 1 || st.Flows.Live[stats.FlowICMP].Load() != 1 {
			t.Errorf("echo replies %d, proto stats: requests %d replies %d flows %d", st.ServiceReplies[stats.SvcICMPEcho].Load(),
				st.Proto.ICMPEchoRequests.Load(), st.Proto.ICMPEchoReplies.Load(), st.Flows.Live[stats.FlowICMP].Load())
		}
	}
}

func TestUDPFlowTableFullEvictsOldest(t *testing.T) {
	p := newFlowPair(t, featModern, func(c *Config) { c.MaxFlows = 2 })
	port := udpEcho(t, "udp4", "127.0.0.1:0")
	p.start()
	for i := 0; i < 3; i++ {
		p.addTX(udpFrame(testGuest4, testGw4, uint16(40000+i), port, []byte("x")))
		p.tx.Send()
		waitFor(t, "sent", 2*time.Second, func() bool { return p.tx.UsedIdx() == uint16(i+1) })
	}
	st := p.stats()
	if dgramOpened(st) != 3 || st.Flows.Evicted[stats.FlowUDP].Load() != 1 || dgramClosed(st) != 1 {
		t.Errorf("opened %d evicted %d closed %d, want 3 1 1", dgramOpened(st), st.Flows.Evicted[stats.FlowUDP].Load(), dgramClosed(st))
	}
	if st.TX.Drops[stats.DropNoFlow].Load() != 0 {
		t.Errorf("datagram dropped instead of evicting")
	}
}

// TestUDPZeroLengthDropped: a UDP length of 0 (an IPv6 jumbogram's, which
// no guest link carries) is malformed: dropped and counted, nothing sent.
// It used to reach the socket layer as a negative length and panic the
// loop, taking the daemon down.
func TestUDPZeroLengthDropped(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		src, gw, network, addr := testGuest4, testGw4, "udp4", "127.0.0.1:0"
		if v6 {
			src, gw, network, addr = testGuest6, testGw6, "udp6", "[::1]:0"
		}
		port := udpEcho(t, network, addr)
		p := newFlowPair(t, featMrg, nil)
		p.start()
		f := udpFrame(src, gw, 40000, port, []byte("abc"))
		l4 := header.EthernetMinimumSize + header.IPv4MinimumSize
		if v6 {
			l4 = header.EthernetMinimumSize + header.IPv6MinimumSize
		}
		binary.BigEndian.PutUint16(f[l4+4:], 0)
		p.addTX(f)
		p.tx.Send()
		st := p.stats()
		waitFor(t, "drop", 2*time.Second, func() bool { return st.Proto.UDPDrops[stats.FromGuest][stats.DropMalformed].Load() == 1 })
		if n := st.Proto.UDPDatagrams[stats.FromGuest].Load(); n != 0 {
			t.Errorf("v6 %v: %d datagrams sent", v6, n)
		}
	}
}

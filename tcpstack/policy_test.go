package tcpstack

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// loopbackSpellings are the ways a guest can write a host loopback address
// in an IPv4 or IPv6 header.
var loopbackSpellings = []string{
	"127.0.0.1", "127.9.9.9", "::1",
	"::ffff:127.0.0.1", "::ffff:127.9.9.9", "::127.0.0.1", "::127.9.9.9",
	// Through a translator or tunnel on the host: NAT64, 6to4, Teredo.
	"64:ff9b::7f00:1", "2002:7f00:1::1", "2001:0:7f00:1::1",
}

// loopbackListeners are host TCP and UDP listeners on 127.0.0.1, 127.9.9.9
// and ::1 at one port, recording what reaches them.
type loopbackListeners struct {
	mu       sync.Mutex
	accepted map[string]int      // listener address → connections accepted
	received map[string][]string // listener address → datagrams received
}

func listenLoopbacks(t *testing.T, port uint16) *loopbackListeners {
	t.Helper()
	ll := &loopbackListeners{accepted: map[string]int{}, received: map[string][]string{}}
	for _, a := range []string{"127.0.0.1", "127.9.9.9", "::1"} {
		ap := netip.AddrPortFrom(netip.MustParseAddr(a), port).String()
		ln, err := net.Listen("tcp", ap)
		if err != nil {
			t.Fatalf("listen tcp %s: %v", ap, err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				ll.mu.Lock()
				ll.accepted[a]++
				ll.mu.Unlock()
				c.Close()
			}
		}()
		pc, err := net.ListenPacket("udp", ap)
		if err != nil {
			t.Fatalf("listen udp %s: %v", ap, err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 2048)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				ll.mu.Lock()
				ll.received[a] = append(ll.received[a], string(buf[:n]))
				ll.mu.Unlock()
			}
		}()
	}
	return ll
}

func (ll *loopbackListeners) reset() {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	ll.accepted, ll.received = map[string]int{}, map[string][]string{}
}

func (ll *loopbackListeners) snapshot() (map[string]int, map[string][]string) {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	acc, rec := map[string]int{}, map[string][]string{}
	for k, v := range ll.accepted {
		acc[k] = v
	}
	for k, v := range ll.received {
		rec[k] = append([]string(nil), v...)
	}
	return acc, rec
}

// TestPolicyHostLoopbackUnreachable sends guest TCP SYNs, UDP datagrams
// and echo requests to every loopback spelling, and from loopback sources
// to the gateway, through the real loop, with the gateway mapping on and
// off: host loopback listeners see nothing of them, each is counted as a
// policy drop, and no RST or reply goes back. With the mapping on, the
// gateway address still reaches the 127.0.0.1 listeners. It runs in a
// private network namespace, where the listeners are the only loopback
// services and the mapping-off gateway has no route.
func TestPolicyHostLoopbackUnreachable(t *testing.T) {
	if !testenv.InPrivateNetns(t, testenv.PingAllowed) {
		return
	}
	const port = 5999
	ll := listenLoopbacks(t, port)
	for _, mapGW := range []bool{true, false} {
		ll.reset()
		p := newFlowPair(t, featModern, func(c *Config) { c.NoMapGateway = !mapGW })
		p.postRX(64, 2048)
		p.start()
		sent := 0
		send := func(f []byte) {
			p.addTX(f)
			sent++
		}
		for i, s := range loopbackSpellings {
			d := netip.MustParseAddr(s)
			src := testGuest4
			if d.Is6() {
				src = testGuest6
			}
			send(tcpGuestFrame(src, d, 40000+uint16(i), port, 1000, 0, header.TCPFlagSYN, nil))
			send(udpFrame(src, d, 40000+uint16(i), port, []byte("to "+s)))
			send(icmpEchoFrame(src, d, 0x100+uint16(i), 1, []byte("ping "+s)))
		}
		// Loopback sources, to the gateway.
		lo4, lo6 := netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()
		send(tcpGuestFrame(lo4, testGw4, 41000, port, 1000, 0, header.TCPFlagSYN, nil))
		send(tcpGuestFrame(lo6, testGw6, 41001, port, 1000, 0, header.TCPFlagSYN, nil))
		send(udpFrame(lo4, testGw4, 41000, port, []byte("from 127.0.0.1")))
		send(udpFrame(lo6, testGw6, 41001, port, []byte("from ::1")))
		send(icmpEchoFrame(lo4, testGw4, 0x200, 1, []byte("ping from lo")))
		send(icmpEchoFrame(lo6, testGw6, 0x201, 1, []byte("ping from lo")))
		// The legitimate gateway traffic, last.
		send(udpFrame(testGuest4, testGw4, 42000, port, []byte("legit")))
		send(tcpGuestFrame(testGuest4, testGw4, 42000, port, 1000, 0, header.TCPFlagSYN, nil))
		p.tx.Send()
		st := p.stats()
		waitFor(t, "TX frames", 3*time.Second, func() bool { return st.TX.Frames.Load() == uint64(sent) })
		if mapGW {
			waitFor(t, "the mapped gateway", 3*time.Second, func() bool {
				acc, rec := ll.snapshot()
				return acc["127.0.0.1"] == 1 && len(rec["127.0.0.1"]) == 1
			})
		}
		time.Sleep(300 * time.Millisecond) // anything that was going to arrive has
		acc, rec := ll.snapshot()
		wantAcc, wantRec := 0, []string(nil)
		if mapGW {
			wantAcc, wantRec = 1, []string{"legit"}
		}
		for _, a := range []string{"127.0.0.1", "127.9.9.9", "::1"} {
			w, wr := 0, []string(nil)
			if a == "127.0.0.1" {
				w, wr = wantAcc, wantRec
			}
			if acc[a] != w || len(rec[a]) != len(wr) || len(wr) == 1 && rec[a][0] != wr[0] {
				t.Errorf("map=%v: host %s accepted %d connections, received %q; want %d, %q", mapGW, a, acc[a], rec[a], w, wr)
			}
		}
		pd := &st.PolicyDrops
		n := uint64(len(loopbackSpellings))
		for _, c := range []struct {
			proto  addrpolicy.Proto
			reason addrpolicy.Reason
			want   uint64
		}{
			{addrpolicy.TCP, addrpolicy.DstLoopback, n},
			{addrpolicy.UDP, addrpolicy.DstLoopback, n},
			{addrpolicy.ICMP, addrpolicy.DstLoopback, n},
			{addrpolicy.TCP, addrpolicy.SrcLoopback, 2},
			{addrpolicy.UDP, addrpolicy.SrcLoopback, 2},
			{addrpolicy.ICMP, addrpolicy.SrcLoopback, 2},
		} {
			if got := pd[c.proto][c.reason].Load(); got != c.want {
				t.Errorf("map=%v: policy drops %v/%v = %d, want %d", mapGW, c.proto, c.reason, got, c.want)
			}
		}
		if got, want := st.TX.Drops[stats.DropPolicy].Load(), 3*n+6; got != want {
			t.Errorf("map=%v: tx drops policy = %d, want %d", mapGW, got, want)
		}
		if got, want := st.Proto.UDPDrops[stats.FromGuest][stats.DropPolicy].Load(), n+2; got != want {
			t.Errorf("map=%v: udp drops policy = %d, want %d", mapGW, got, want)
		}
		if got, want := dgramOpened(st), uint64(0); mapGW && got != 1 || !mapGW && got != want {
			t.Errorf("map=%v: %d flows opened", mapGW, got)
		}
		// Refused segments get no RST and refused pings no reply: the only
		// frame to the guest answers the gateway SYN, a SYN-ACK from the
		// mapped gateway, or an RST when the real one (mapping off) has
		// no route in this namespace.
		wantFlags := header.TCPFlagRST | header.TCPFlagACK
		if mapGW {
			wantFlags = header.TCPFlagSYN | header.TCPFlagACK
		}
		waitFor(t, "the answer to the gateway SYN", 3*time.Second, func() bool { return p.rxFrames(1) >= 1 })
		_, frames := p.rxReadIP(t)
		if len(frames) != 1 {
			t.Fatalf("map=%v: %d frames to the guest, want 1", mapGW, len(frames))
		}
		if seg := guestTCP(t, frames[0], testGw4, testGuest4); seg == nil || seg.Flags() != wantFlags || seg.DestinationPort() != 42000 {
			t.Errorf("map=%v: frame to the guest %x, want flags %v to port 42000", mapGW, frames[0], wantFlags)
		}
		p.s.Close()
	}
}

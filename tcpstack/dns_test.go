package tcpstack

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
)

// The DNS forward (DESIGN "Addresses"): a host resolver on the host's
// loopback, as /etc/resolv.conf names it (127.0.0.53 for
// systemd-resolved), is reached by the guest at the gateway address, port
// 53, over UDP and TCP alike. These tests guard both transports against a
// resolver that is not the gateway mapping's 127.0.0.1.

// testResolver is a DNS server on a host loopback address: UDP and TCP on
// port 53, answering every query with dnsAnswer and recording what came
// in, by transport.
type testResolver struct {
	mu      sync.Mutex
	queries map[string][][]byte // "udp" / "tcp" → queries received
}

// dnsQuery is a query for name's A (or AAAA) record with id.
func dnsQuery(id uint16, name string, aaaa bool) []byte {
	b := binary.BigEndian.AppendUint16(nil, id)
	b = append(b, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) // RD; one question
	for _, l := range bytes.Split([]byte(name), []byte(".")) {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	typ := uint16(1)
	if aaaa {
		typ = 28
	}
	b = append(b, 0)
	b = binary.BigEndian.AppendUint16(b, typ)
	return binary.BigEndian.AppendUint16(b, 1)
}

// dnsAnswer is the resolver's answer to q: its ID and question, and one
// record whose address is derived from the query's bytes, so that every
// answer differs and a wrong or mixed-up one shows.
func dnsAnswer(q []byte) []byte {
	a := append([]byte(nil), q[:2]...)
	a = append(a, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0) // response, RD, RA; 1 question, 1 answer
	a = append(a, q[12:]...)
	typ := binary.BigEndian.Uint16(q[len(q)-4:])
	a = append(a, 0xc0, 12) // the question's name
	a = binary.BigEndian.AppendUint16(a, typ)
	a = append(a, 0, 1, 0, 0, 0, 60) // IN, TTL 60
	rd := []byte{192, 0, 2, q[1]}
	if typ == 28 {
		rd = append([]byte{0x20, 0x01, 0x0d, 0xb8}, make([]byte, 11)...)
		rd = append(rd, q[1])
	}
	a = binary.BigEndian.AppendUint16(a, uint16(len(rd)))
	return append(a, rd...)
}

// startResolver listens on addr port 53 (UDP and TCP).
func startResolver(t *testing.T, addr netip.Addr) *testResolver {
	t.Helper()
	r := &testResolver{queries: map[string][][]byte{}}
	ap := netip.AddrPortFrom(addr, 53).String()
	pc, err := net.ListenPacket("udp", ap)
	if err != nil {
		t.Fatalf("resolver: %v", err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := append([]byte(nil), buf[:n]...)
			r.note("udp", q)
			pc.WriteTo(dnsAnswer(q), from)
		}
	}()
	ln, err := net.Listen("tcp", ap)
	if err != nil {
		t.Fatalf("resolver: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				var l [2]byte
				for {
					if _, err := io.ReadFull(c, l[:]); err != nil {
						return
					}
					q := make([]byte, binary.BigEndian.Uint16(l[:]))
					if _, err := io.ReadFull(c, q); err != nil {
						return
					}
					r.note("tcp", q)
					a := dnsAnswer(q)
					c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...))
				}
			}()
		}
	}()
	return r
}

func (r *testResolver) note(transport string, q []byte) {
	r.mu.Lock()
	r.queries[transport] = append(r.queries[transport], q)
	r.mu.Unlock()
}

func (r *testResolver) got(transport string) [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.queries[transport]...)
}

// guestUDPQuery sends q from the guest to gw:53 and returns the answer's
// payload, checked to come from gw:53 to the guest's port.
func guestUDPQuery(t *testing.T, p *testPair, guest, gw netip.Addr, sport uint16, q []byte) []byte {
	t.Helper()
	p.addTX(udpFrame(guest, gw, sport, 53, q))
	p.tx.Send()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		hdrs, frames := p.rxReadIP(t)
		for i, f := range frames {
			var pk header.Packet
			if err := header.ParseFrame(f, len(f), &pk); err != nil || pk.Protocol != header.IPProtocolUDP {
				continue
			}
			u := header.UDP(f[pk.L4Off : pk.L4Off+pk.L4Len])
			checkUDPFrame(t, hdrs[i], f, gw, guest, 53, sport, u.Payload())
			return append([]byte(nil), u.Payload()...)
		}
		for p.rx.Free() > 0 && p.rx.Q != nil {
			p.rx.AddBuffers(nil, 2048)
		}
		p.rx.Send()
		time.Sleep(time.Millisecond)
	}
	st := p.stats()
	var drops []string
	for r := range st.TX.Drops {
		if n := st.TX.Drops[r].Load(); n > 0 {
			drops = append(drops, fmt.Sprintf("%v=%d", stats.DropReason(r), n))
		}
	}
	t.Fatalf("no DNS answer over UDP from %v: flows opened %d, TX drops %v", gw, dgramOpened(st), drops)
	return nil
}

// lateSegment reports whether frame is a TCP segment of an earlier
// query's connection: to another guest address (the other family) or
// port. The daemon's FIN-ACK to the guest's FIN that ends a query can
// come after the next query began.
func lateSegment(frame []byte, guest netip.Addr, sport uint16) bool {
	var p header.Packet
	if header.ParseFrame(frame, len(frame), &p) != nil || p.Protocol != header.IPProtocolTCP || len(p.L4) < 4 {
		return false
	}
	return p.Dst != guest || binary.BigEndian.Uint16(p.L4[2:4]) != sport
}

// guestTCPQuery opens a guest TCP connection to gw:53, sends q with its
// length prefix, and returns the answer without it; the segments must come
// from gw:53.
func guestTCPQuery(t *testing.T, p *testPair, guest, gw netip.Addr, sport uint16, q []byte) []byte {
	t.Helper()
	next := (&segWatch{t: t, p: p, src: gw, dst: guest,
		skip: func(f []byte) bool { return lateSegment(f, guest, sport) },
		check: func(s header.TCP) {
			if s.SourcePort() != 53 || s.DestinationPort() != sport {
				t.Fatalf("segment %d → %d, want 53 → %d", s.SourcePort(), s.DestinationPort(), sport)
			}
		},
	}).next
	const gseq = 7000
	p.addTX(tcpGuestFrame(guest, gw, sport, 53, gseq, 0, header.TCPFlagSYN, nil))
	p.tx.Send()
	synAck := next("SYN-ACK", func(s header.TCP) bool { return s.Flags().Has(header.TCPFlagSYN | header.TCPFlagACK) })
	if synAck.AckNumber() != gseq+1 {
		t.Fatalf("SYN-ACK acknowledges %d", synAck.AckNumber())
	}
	hseq := synAck.SequenceNumber() + 1
	msg := append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)
	p.addTX(tcpGuestFrame(guest, gw, sport, 53, gseq+1, hseq, header.TCPFlagACK|header.TCPFlagPSH, msg))
	p.tx.Send()
	var got []byte
	for {
		s := next("answer", func(s header.TCP) bool { return len(s.Payload()) > 0 })
		if s.SequenceNumber() != hseq+uint32(len(got)) {
			t.Fatalf("answer segment at %d, want %d", s.SequenceNumber()-hseq, len(got))
		}
		got = append(got, s.Payload()...)
		if len(got) >= 2 && len(got) >= 2+int(binary.BigEndian.Uint16(got)) {
			break
		}
	}
	n := int(binary.BigEndian.Uint16(got))
	if len(got) != 2+n {
		t.Fatalf("answer of %d bytes with a length prefix of %d", len(got)-2, n)
	}
	// Close as a resolver's client does: FIN after the answer.
	p.addTX(tcpGuestFrame(guest, gw, sport, 53, gseq+1+uint32(len(msg)), hseq+uint32(len(got)), header.TCPFlagACK|header.TCPFlagFIN, nil))
	p.tx.Send()
	return got[2:]
}

// TestDNSForwardThroughGateway: in a private network namespace, a
// resolver listens on 127.0.0.53 and ::1, port 53, and nothing on
// 127.0.0.1:53 (where the gateway mapping would go). The daemon's
// configuration forwards to it as host detection makes it do for such a
// resolv.conf (DNSForward4/6, the gateway announced as the guest's DNS).
// The guest asks the gateway at port 53, over UDP and over TCP, IPv4 and
// IPv6, with the gateway mapping on (the default, where cmd/vunet takes
// the loopback resolver from resolv.conf) and off (where only an explicit
// --dns-forward or --dns-host keeps it): every answer is the resolver's,
// byte for byte, from the gateway's port 53, and the resolver saw every
// query. With the forward restricted to UDP (as before the address-policy
// work) the TCP queries go to 127.0.0.1:53 and fail here.
func TestDNSForwardThroughGateway(t *testing.T) {
	if !testenv.InPrivateNetns(t, nil) {
		return
	}
	resolver4, resolver6 := netip.MustParseAddr("127.0.0.53"), netip.IPv6Loopback()
	res4, res6 := startResolver(t, resolver4), startResolver(t, resolver6)
	if _, err := net.Dial("tcp", "127.0.0.1:53"); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("something answers on 127.0.0.1:53 (%v): the test could not tell the forward from the gateway mapping", err)
	}
	id := uint16(0x4a00)
	for _, mapGW := range []bool{true, false} {
		p := newFlowPair(t, featModern, func(c *Config) {
			c.NoMapGateway = !mapGW
			c.Addr.DNSForward4, c.Addr.DNSForward6 = resolver4, resolver6
		})
		p.postRX(64, 2048)
		p.start()
		for _, c := range []struct {
			name      string
			guest, gw netip.Addr
			res       *testResolver
			aaaa      bool
		}{
			{"v4", testGuest4, testGw4, res4, false},
			{"v6", testGuest6, testGw6, res6, true},
		} {
			for _, transport := range []string{"udp", "tcp"} {
				id++
				q := dnsQuery(id, "host.vunet.test", c.aaaa)
				before := len(c.res.got(transport))
				var a []byte
				if transport == "udp" {
					a = guestUDPQuery(t, p, c.guest, c.gw, 40000+id%1000, q)
				} else {
					a = guestTCPQuery(t, p, c.guest, c.gw, 41000+id%1000, q)
				}
				if want := dnsAnswer(q); !bytes.Equal(a, want) {
					t.Errorf("map %v %s %s: answer\n%x\nwant the resolver's\n%x", mapGW, c.name, transport, a, want)
				}
				qs := c.res.got(transport)
				if len(qs) != before+1 || !bytes.Equal(qs[len(qs)-1], q) {
					t.Errorf("map %v %s %s: the resolver at %v saw %d new queries", mapGW, c.name, transport, c.gw, len(qs)-before)
				}
			}
		}
		p.s.StopPair(0)
	}
}

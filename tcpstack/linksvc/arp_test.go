package linksvc

import (
	"net/netip"
	"testing"

	"vunet/tcpstack/header"
)

func svcTestARPFrame(op header.ARPOp, sha header.MAC, sip, tip string) []byte {
	b := make([]byte, 60) // minimum Ethernet frame: 18 bytes of padding
	header.EncodeEthernet(b, header.BroadcastMAC, sha, header.EtherTypeARP)
	header.EncodeARP(b[14:], op, sha, netip.MustParseAddr(sip), header.MAC{}, netip.MustParseAddr(tip))
	return b
}

func TestARPServiceHandle(t *testing.T) {
	tests := []struct {
		name  string
		frame []byte
		reply bool
	}{
		{"gateway", svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.20", "192.168.10.1"), true},
		{"other-on-link", svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.20", "192.168.10.77"), true},
		{"off-link", svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.20", "8.8.8.8"), true},
		{"probe-other", svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "0.0.0.0", "192.168.10.1"), true},
		{"probe-own", svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "0.0.0.0", "192.168.10.20"), false},
		{"guest-own", svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.20", "192.168.10.20"), false},
		{"announcement", svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.33", "192.168.10.33"), false},
		{"reply", svcTestARPFrame(header.ARPReply, svcTestGuestMAC, "192.168.10.20", "192.168.10.1"), false},
		{"truncated", svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.20", "192.168.10.1")[:41], false},
		{"not-arp", svcTestHex(t, svcTestCapRS), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := arpService{svcTestConfig()}
			out := make([]byte, 1514)
			n := handle(s.answer, tt.frame, out)
			if !tt.reply {
				if n != 0 {
					t.Fatalf("replied %x", out[:n])
				}
				return
			}
			if n != 42 {
				t.Fatalf("reply length %d", n)
			}
			req, _ := header.ParseARP(tt.frame[14:])
			want := make([]byte, 42)
			header.EncodeEthernet(want, svcTestGuestMAC, svcTestOurMAC, header.EtherTypeARP)
			header.EncodeARP(want[14:], header.ARPReply, svcTestOurMAC, req.TargetIP(), svcTestGuestMAC, req.SenderIP())
			if string(out[:n]) != string(want) {
				t.Errorf("reply\n got %x\nwant %x", out[:n], want)
			}
			// Field by field, in case EncodeARP itself were wrong.
			a, err := header.ParseARP(out[14:n])
			if err != nil || a.Op() != header.ARPReply || a.SenderMAC() != svcTestOurMAC || a.SenderIP() != req.TargetIP() ||
				a.TargetMAC() != svcTestGuestMAC || a.TargetIP() != req.SenderIP() || string(out[12:14]) != "\x08\x06" {
				t.Errorf("reply fields %x", out[:n])
			}
		})
	}
}

func TestARPServiceDisabledAndShortOut(t *testing.T) {
	req := svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.20", "192.168.10.1")
	cfg := svcTestConfig()
	cfg.Disable4 = true
	s := arpService{cfg}
	if handle(s.answer, req, make([]byte, 100)) != 0 || s.gratuitousARP(make([]byte, 100)) != 0 {
		t.Error("replied with IPv4 disabled")
	}
	s = arpService{svcTestConfig()}
	if handle(s.answer, req, make([]byte, 41)) != 0 {
		t.Error("wrote into a too-short buffer")
	}
	if handle(arpService{}.answer, req, make([]byte, 100)) != 0 {
		t.Error("replied without config")
	}
}

func TestARPAnnouncements(t *testing.T) {
	out := make([]byte, 64)
	n := New(svcTestConfig()).GratuitousARP(out)
	want := "ffffffffffff9a559a559a55080600010800060400019a559a559a55c0a80a01000000000000c0a80a01"
	if hexOf(out[:n]) != want {
		t.Errorf("gratuitous ARP\n got %x\nwant %s", out[:n], want)
	}
	if New(svcTestConfig()).GratuitousARP(out[:41]) != 0 {
		t.Error("short buffer accepted")
	}
}

// handle is a service's answer as the tests call it: on the raw frame,
// parsed first as the data path does (a frame that does not parse gets no
// answer).
func handle(answer func(*header.Packet, []byte, []byte) (int, Reply), frame, out []byte) int {
	n, _ := handleReply(answer, frame, out)
	return n
}

func handleReply(answer func(*header.Packet, []byte, []byte) (int, Reply), frame, out []byte) (int, Reply) {
	p := &testPacket // as the loop's own: a Packet on the stack would escape through answer
	if header.ParseFrame(frame, len(frame), p) != nil {
		return 0, ReplyNone
	}
	return answer(p, frame, out)
}

var testPacket header.Packet

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	s := make([]byte, 0, 2*len(b))
	for _, c := range b {
		s = append(s, digits[c>>4], digits[c&0xf])
	}
	return string(s)
}

// FuzzLinkServices feeds arbitrary guest frames to every link service:
// none may panic, write past out, or produce a frame that does not parse.
func FuzzLinkServices(f *testing.F) {
	f.Add(svcTestHex(f, svcTestCapDHCPDiscover))
	f.Add(svcTestHex(f, svcTestCapRS))
	f.Add(svcTestHex(f, svcTestCapDADNS))
	f.Add(svcTestARPFrame(header.ARPRequest, svcTestGuestMAC, "192.168.10.20", "192.168.10.1"))
	f.Add(svcTestDHCPv6Frame(f, svcTestSolicitRapid))
	f.Add(svcTestDHCPv6Frame(f, "041a2b3c"+d6ClientID+d6IANAOurAddr))
	l := New(svcTestConfig())
	handlers := []func(*header.Packet, []byte, []byte) (int, Reply){l.ARP, l.DHCP, l.DHCPv6, l.NDP}
	f.Fuzz(func(t *testing.T, frame []byte) {
		for _, outLen := range []int{1514, 100} {
			for i, h := range handlers {
				out := make([]byte, outLen+8)
				n := handle(h, frame, out[:outLen])
				if n < 0 || n > outLen {
					t.Fatalf("handler %d returned %d for a %d-byte buffer", i, n, outLen)
				}
				if string(out[outLen:]) != "\x00\x00\x00\x00\x00\x00\x00\x00" {
					t.Fatalf("handler %d wrote past out", i)
				}
				if n == 0 {
					continue
				}
				eth, err := header.ParseEthernet(out[:n])
				if err != nil {
					t.Fatalf("handler %d reply does not parse: %v", i, err)
				}
				switch eth.Type() {
				case header.EtherTypeIPv4:
					if ip, err := header.ParseIPv4(eth.Payload()); err != nil || !ip.IsChecksumValid() {
						t.Fatalf("handler %d: bad IPv4 reply %v", i, err)
					}
				case header.EtherTypeIPv6:
					if _, err := header.ParseIPv6(eth.Payload()); err != nil {
						t.Fatalf("handler %d: bad IPv6 reply %v", i, err)
					}
				}
			}
		}
	})
}

// checkOptions walks an option list with next and compares each option,
// header included, as hex with want, in order.
func checkOptions(t *testing.T, opts []byte, next func([]byte) (rest []byte, ok bool, err error), want []string) {
	t.Helper()
	var got []string
	for {
		rest, ok, err := next(opts)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got = append(got, hexOf(opts[:len(opts)-len(rest)]))
		opts = rest
	}
	if len(got) != len(want) {
		t.Fatalf("options\n got %q\nwant %q", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("option %d\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}

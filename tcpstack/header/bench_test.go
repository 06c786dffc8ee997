package header

import (
	"net/netip"
	"testing"
)

var (
	benchSrc4 = netip.MustParseAddr("10.77.0.1")
	benchDst4 = netip.MustParseAddr("10.77.0.2")
	sinkInt   int
)

// parseTCPv4Frame is the TX-path parse sequence for one guest TCP segment.
func parseTCPv4Frame(frame []byte) int {
	e, err := ParseEthernet(frame)
	if err != nil {
		return 0
	}
	ip, err := ParseIPv4(e.Payload())
	if err != nil || ip.IsFragment() {
		return 0
	}
	tc, err := ParseTCP(ip.Payload())
	if err != nil {
		return 0
	}
	var o TCPOptions
	if ParseTCPOptions(tc.Options(), &o) != nil {
		return 0
	}
	return int(o.MSS) + int(tc.SourcePort()) + len(tc.Payload())
}

// buildTCPv4Frame is the RX-path build sequence for one segment to the guest.
func buildTCPv4Frame(b []byte, payload int) int {
	var opts [TCPMaxOptionsSize]byte
	o := TCPOptions{HasTimestamps: true, TSVal: 1, TSEcr: 2}
	on := EncodeTCPOptions(opts[:], &o)
	n := EncodeEthernet(b, MAC{2}, MAC{0x9a, 0x55}, EtherTypeIPv4)
	thl := TCPMinimumSize + on
	ipn := EncodeIPv4(b[n:], &IPv4Fields{TotalLength: uint16(IPv4MinimumSize + thl + payload), TTL: 64,
		Protocol: IPProtocolTCP, Source: benchSrc4, Destination: benchDst4, Flags: IPv4FlagDontFragment})
	tn := EncodeTCP(b[n+ipn:], &TCPFields{SrcPort: 80, DstPort: 40000, SeqNum: 1, AckNum: 2, Flags: TCPFlagACK | TCPFlagPSH, WindowSize: 65535, Options: opts[:on]})
	seg := TCP(b[n+ipn : n+ipn+tn+payload])
	seg.SetChecksum(benchSrc4, benchDst4)
	return n + ipn + tn + payload
}

func capturedSYNFrame(t testing.TB) []byte {
	ip := mustHex(t, capIPv4TCPSYN)
	frame := make([]byte, EthernetMinimumSize+len(ip))
	EncodeEthernet(frame, MAC{0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55}, MAC{0x52, 0x54}, EtherTypeIPv4)
	copy(frame[EthernetMinimumSize:], ip)
	return frame
}

func BenchmarkParseTCPv4Frame(b *testing.B) {
	frame := capturedSYNFrame(b)
	b.ReportAllocs()
	for b.Loop() {
		sinkInt += parseTCPv4Frame(frame)
	}
}

func BenchmarkBuildTCPv4Frame1460(b *testing.B) {
	buf := make([]byte, 2048)
	b.ReportAllocs()
	b.SetBytes(1460)
	for b.Loop() {
		sinkInt += buildTCPv4Frame(buf, 1460)
	}
}

func BenchmarkIPv6UpperLayer(b *testing.B) {
	ip, _ := ParseIPv6(mustHex(b, capMLDv2HopByHop)[EthernetMinimumSize:])
	b.ReportAllocs()
	for b.Loop() {
		ul, _ := ip.UpperLayer()
		sinkInt += ul.Offset
	}
}

func BenchmarkDHCPv4ParseAndBuild(b *testing.B) {
	req := mustHex(b, capDHCPDiscover)[42:]
	out := make([]byte, 600)
	search := []string{"example.com", "lab.example.com"}
	b.ReportAllocs()
	for b.Loop() {
		sinkInt += dhcpv4RoundTrip(req, out, search)
	}
}

func dhcpv4RoundTrip(req, out []byte, search []string) int {
	m, err := ParseDHCPv4(req)
	if err != nil || m.MessageType() != DHCPDiscover {
		return 0
	}
	var w DHCPv4Builder
	w.Reset(out, &DHCPv4Fields{Op: DHCPv4OpReply, TransactionID: m.TransactionID(), YourIP: benchDst4, ClientMAC: m.ClientMAC()})
	w.AddOptionByte(DHCPv4OptMessageType, uint8(DHCPOffer))
	w.AddOptionAddrs(DHCPv4OptRouter, benchSrc4)
	w.AddOptionDomainSearch(search)
	n, _ := w.Finish()
	return n
}

// TestHotPathsDoNotAllocate keeps the zero-allocation promise checked by
// plain `go test`, not only by whoever reads benchmark output.
func TestHotPathsDoNotAllocate(t *testing.T) {
	frame := capturedSYNFrame(t)
	buf := make([]byte, 2048)
	ip6, _ := ParseIPv6(mustHex(t, capMLDv2HopByHop)[EthernetMinimumSize:])
	req := mustHex(t, capDHCPDiscover)[42:]
	search := []string{"example.com"}
	var w6 DHCPv6Builder
	cases := map[string]func(){
		"parse-tcp":    func() { sinkInt += parseTCPv4Frame(frame) },
		"build-tcp":    func() { sinkInt += buildTCPv4Frame(buf, 100) },
		"ipv6-walk":    func() { ul, _ := ip6.UpperLayer(); sinkInt += ul.Offset },
		"dhcpv4":       func() { sinkInt += dhcpv4RoundTrip(req, buf, search) },
		"checksum":     func() { sinkInt += int(Checksum(buf, 0)) },
		"pseudoheader": func() { sinkInt += int(PseudoHeaderChecksum(IPProtocolUDP, IPv6AllNodes, IPv6AllRouters, 8)) },
		"dhcpv6": func() {
			w6.Reset(buf, DHCPv6Reply, 1)
			w6.AddOptionDomainList(DHCPv6OptDomainList, search)
			w6.AddOptionAddrs(DHCPv6OptDNSServers, IPv6AllNodes)
			n, _ := w6.Finish()
			sinkInt += n
		},
		"ndp": func() {
			n := EncodeNDPRouterAdvert(buf, &NDPRouterAdvertFields{RouterLifetime: 1})
			n += EncodeNDPDNSSL(buf[n:], 1, search)
			n += EncodeNDPRDNSS(buf[n:], 1, IPv6AllNodes)
			ICMPv6(buf[:n]).SetChecksum(IPv6AllNodes, IPv6AllRouters)
			sinkInt += n
		},
	}
	for name, fn := range cases {
		if a := testing.AllocsPerRun(100, fn); a != 0 {
			t.Errorf("%s: %v allocs per run", name, a)
		}
	}
	if parseTCPv4Frame(frame) == 0 {
		t.Error("benchmark parse path rejected the captured SYN")
	}
	n := buildTCPv4Frame(buf, 100)
	ip, _ := ParseIPv4(buf[EthernetMinimumSize:n])
	tc, _ := ParseTCP(ip.Payload())
	if !ip.IsChecksumValid() || !tc.IsChecksumValid(benchSrc4, benchDst4) {
		t.Error("built frame checksums do not verify")
	}
}

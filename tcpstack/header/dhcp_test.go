package header

import (
	"net/netip"
	"strings"
	"testing"
)

func TestCapturedDHCPDiscover(t *testing.T) {
	e, err := ParseEthernet(mustHex(t, capDHCPDiscover))
	if err != nil {
		t.Fatal(err)
	}
	if !e.Destination().IsBroadcast() || e.Type() != EtherTypeIPv4 {
		t.Fatalf("ethernet dst %v type %v", e.Destination(), e.Type())
	}
	ip, err := ParseIPv4(e.Payload())
	if err != nil {
		t.Fatal(err)
	}
	if !ip.IsChecksumValid() || ip.Source() != netip.IPv4Unspecified() || ip.Destination() != netip.MustParseAddr("255.255.255.255") {
		t.Fatalf("ip %v -> %v valid %v", ip.Source(), ip.Destination(), ip.IsChecksumValid())
	}
	u, err := ParseUDP(ip.Payload())
	if err != nil {
		t.Fatal(err)
	}
	if !u.IsChecksumValid(ip.Source(), ip.Destination()) || u.SourcePort() != DHCPv4ClientPort || u.DestinationPort() != DHCPv4ServerPort {
		t.Fatalf("udp ports %d->%d", u.SourcePort(), u.DestinationPort())
	}
	m, err := ParseDHCPv4(u.Payload())
	if err != nil {
		t.Fatal(err)
	}
	if m.Op() != DHCPv4OpRequest || m.HardwareType() != 1 || m.HardwareLen() != 6 || m.TransactionID() != 0x3ec62956 || m.Broadcast() {
		t.Errorf("fixed fields op %d htype %d hlen %d xid %#x flags %#x", m.Op(), m.HardwareType(), m.HardwareLen(), m.TransactionID(), m.Flags())
	}
	if m.ClientMAC() != (MAC{0x52, 0x54, 0, 0x12, 0x34, 0x56}) || m.ClientIP().IsValid() && !m.ClientIP().IsUnspecified() {
		t.Errorf("chaddr %v ciaddr %v", m.ClientMAC(), m.ClientIP())
	}
	if m.MessageType() != DHCPDiscover {
		t.Errorf("message type %d", m.MessageType())
	}
	if d, ok := m.Option(DHCPv4OptHostName); !ok || string(d) != "guest" {
		t.Errorf("hostname %q %v", d, ok)
	}
	if d, ok := m.Option(DHCPv4OptParamRequest); !ok || string(d) != "\x01\x03\x06\x0c\x0f\x1c\x2a\x77" {
		t.Errorf("parameter request list %x", d)
	}
	if d, ok := m.Option(DHCPv4OptMaxMessageSize); !ok || len(d) != 2 || d[0] != 0x02 || d[1] != 0x40 {
		t.Errorf("max message size %x", d)
	}
	if _, ok := m.Option(DHCPv4OptRequestedIP); ok {
		t.Error("found a requested IP the client did not send")
	}
}

func TestDHCPv4OptionWalkErrors(t *testing.T) {
	tests := []struct {
		name string
		opts []byte
		ok   bool
		err  bool
	}{
		{"pads-then-end", []byte{0, 0, 0, 255, 53, 1, 1}, false, false},
		{"empty", nil, false, false},
		{"no-length", []byte{53}, false, true},
		{"length-past", []byte{53, 5, 1}, false, true},
		{"zero-length", []byte{80, 0}, true, false},
	}
	for _, tt := range tests {
		_, _, _, ok, err := NextDHCPv4Option(tt.opts)
		if ok != tt.ok || (err != nil) != tt.err {
			t.Errorf("%s: ok %v err %v", tt.name, ok, err)
		}
	}
}

func TestDHCPv4Builder(t *testing.T) {
	buf := make([]byte, 1500)
	var w DHCPv4Builder
	w.Reset(buf, &DHCPv4Fields{Op: DHCPv4OpReply, TransactionID: 0x01020304, Flags: DHCPv4BroadcastFlag,
		YourIP: netip.MustParseAddr("192.168.1.10"), ServerIP: netip.MustParseAddr("192.168.1.1"),
		ClientMAC: MAC{1, 2, 3, 4, 5, 6}})
	w.AddOptionByte(DHCPv4OptMessageType, uint8(DHCPOffer))
	w.AddOptionAddrs(DHCPv4OptRouter, netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("::1"))
	w.AddOptionUint16(DHCPv4OptInterfaceMTU, 1500)
	w.AddOptionUint32(DHCPv4OptLeaseTime, 0xffffffff)
	w.AddOption(DHCPv4OptRapidCommit, nil)
	// Enough names that option 119 needs splitting (RFC 3396).
	var names []string
	for i := 0; i < 20; i++ {
		names = append(names, strings.Repeat("x", 10)+".example.com")
	}
	w.AddOptionDomainSearch(names)
	n, ok := w.Finish()
	if !ok {
		t.Fatal("Finish failed")
	}
	m, err := ParseDHCPv4(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	if m.Op() != DHCPv4OpReply || m.TransactionID() != 0x01020304 || !m.Broadcast() || m.YourIP() != netip.MustParseAddr("192.168.1.10") || m.ClientMAC() != (MAC{1, 2, 3, 4, 5, 6}) {
		t.Errorf("fixed fields %x", buf[:44])
	}
	if m.MessageType() != DHCPOffer {
		t.Errorf("message type %d", m.MessageType())
	}
	if a, ok := m.OptionAddr(DHCPv4OptRouter); !ok || a != netip.MustParseAddr("192.168.1.1") {
		t.Errorf("router %v (the IPv6 entry must be skipped)", a)
	}
	if d, _ := m.Option(DHCPv4OptInterfaceMTU); string(d) != "\x05\xdc" {
		t.Errorf("mtu %x", d)
	}
	if d, ok := m.Option(DHCPv4OptRapidCommit); !ok || len(d) != 0 {
		t.Errorf("rapid commit %x %v", d, ok)
	}
	// Reassemble the split search option and compare with the encoding.
	var joined []byte
	pieces := 0
	for opts := m.Options(); ; {
		c, d, rest, ok, err := NextDHCPv4Option(opts)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if c == DHCPv4OptDomainSearch {
			joined = append(joined, d...)
			pieces++
		}
		opts = rest
	}
	var want []byte
	for _, name := range names {
		var tmp [255]byte
		want = append(want, tmp[:EncodeDomainName(tmp[:], name)]...)
	}
	if pieces != 2 || string(joined) != string(want) {
		t.Errorf("search list in %d pieces, %d bytes, want 2 pieces %d bytes", pieces, len(joined), len(want))
	}
	// A buffer that is too small fails cleanly.
	w.Reset(buf[:250], &DHCPv4Fields{})
	w.AddOptionDomainSearch(names)
	if _, ok := w.Finish(); ok {
		t.Error("overflowing builder reported success")
	}
	w.Reset(buf[:10], &DHCPv4Fields{})
	w.AddOptionByte(53, 1)
	if _, ok := w.Finish(); ok {
		t.Error("tiny buffer reported success")
	}
}

func TestDHCPv6ParseAndBuild(t *testing.T) {
	m, err := ParseDHCPv6(mustHex(t, dhcpv6Solicit))
	if err != nil {
		t.Fatal(err)
	}
	if m.MessageType() != DHCPv6Solicit || m.TransactionID() != 0x1a2b3c {
		t.Fatalf("type %d xid %#x", m.MessageType(), m.TransactionID())
	}
	if d, ok := m.Option(DHCPv6OptClientID); !ok || len(d) != 14 {
		t.Errorf("client id %x", d)
	}
	if _, ok := m.Option(DHCPv6OptRapidCommit); !ok {
		t.Error("rapid commit missing")
	}
	d, ok := m.Option(DHCPv6OptIANA)
	ia, err := ParseDHCPv6IANA(d)
	if !ok || err != nil || ia.IAID() != 0x3456 || len(ia.Options()) != 0 {
		t.Fatalf("IA_NA %x %v", d, err)
	}

	buf := make([]byte, 512)
	var w DHCPv6Builder
	w.Reset(buf, DHCPv6Reply, 0x1a2b3c)
	w.AddOption(DHCPv6OptServerID, []byte{0, 3, 0, 1, 1, 2, 3, 4, 5, 6})
	w.BeginOption(DHCPv6OptIANA)
	w.WriteUint32(0x3456)
	w.WriteUint32(DHCPv6Infinity)
	w.WriteUint32(DHCPv6Infinity)
	w.BeginOption(DHCPv6OptIAAddr)
	w.WriteAddr(netip.MustParseAddr("2001:db8::5"))
	w.WriteUint32(100)
	w.WriteUint32(200)
	w.EndOption()
	w.EndOption()
	w.AddOptionAddrs(DHCPv6OptDNSServers, netip.MustParseAddr("2001:db8::53"), netip.MustParseAddr("10.0.0.1"))
	w.AddOptionDomainList(DHCPv6OptDomainList, []string{"example.com", "a..bad"})
	w.AddStatusCode(DHCPv6StatusSuccess, "ok")
	n, ok := w.Finish()
	if !ok {
		t.Fatal("Finish failed")
	}
	r, _ := ParseDHCPv6(buf[:n])
	if r.MessageType() != DHCPv6Reply || r.TransactionID() != 0x1a2b3c {
		t.Errorf("header %x", buf[:4])
	}
	d, _ = r.Option(DHCPv6OptIANA)
	ia, err = ParseDHCPv6IANA(d)
	if err != nil || ia.IAID() != 0x3456 || ia.T1() != DHCPv6Infinity || ia.T2() != DHCPv6Infinity {
		t.Fatalf("IA_NA %x", d)
	}
	ad, ok := FindDHCPv6Option(ia.Options(), DHCPv6OptIAAddr)
	a, err := ParseDHCPv6IAAddr(ad)
	if !ok || err != nil || a.Address() != netip.MustParseAddr("2001:db8::5") || a.PreferredLifetime() != 100 || a.ValidLifetime() != 200 {
		t.Fatalf("IAADDR %x", ad)
	}
	if d, _ := r.Option(DHCPv6OptDNSServers); len(d) != 16 {
		t.Errorf("DNS servers %x (IPv4 entry must be skipped)", d)
	}
	if d, _ := r.Option(DHCPv6OptDomainList); hexString(d) != "076578616d706c6503636f6d00" {
		t.Errorf("domain list %x", d)
	}
	if d, _ := r.Option(DHCPv6OptStatusCode); string(d) != "\x00\x00ok" {
		t.Errorf("status %x", d)
	}
	// Unbalanced nesting and overflow fail.
	w.Reset(buf, DHCPv6Reply, 1)
	w.BeginOption(3)
	if _, ok := w.Finish(); ok {
		t.Error("open option accepted")
	}
	w.Reset(buf[:8], DHCPv6Reply, 1)
	w.AddOption(1, make([]byte, 10))
	if _, ok := w.Finish(); ok {
		t.Error("overflow accepted")
	}
	if _, _, _, _, err := NextDHCPv6Option([]byte{0, 1, 0, 9, 1}); err == nil {
		t.Error("option length past the list accepted")
	}
	if _, _, _, _, err := NextDHCPv6Option([]byte{0, 1, 0}); err == nil {
		t.Error("short option header accepted")
	}
}

func TestARP(t *testing.T) {
	b := make([]byte, ARPSize)
	n := EncodeARP(b, ARPRequest, MAC{1, 2, 3, 4, 5, 6}, netip.MustParseAddr("10.0.0.2"), MAC{}, netip.MustParseAddr("10.0.0.1"))
	want := "0001080006040001010203040506" + "0a000002" + "000000000000" + "0a000001"
	if n != ARPSize || hexString(b) != want {
		t.Fatalf("EncodeARP = %x", b)
	}
	a, err := ParseARP(append(b, 0, 0)) // trailing Ethernet padding
	if err != nil || len(a) != ARPSize {
		t.Fatal(err)
	}
	if a.Op() != ARPRequest || a.SenderMAC() != (MAC{1, 2, 3, 4, 5, 6}) || a.SenderIP() != netip.MustParseAddr("10.0.0.2") || a.TargetIP() != netip.MustParseAddr("10.0.0.1") || !a.TargetMAC().IsZero() {
		t.Errorf("fields %x", []byte(a))
	}
}

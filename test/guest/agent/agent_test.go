package main

import (
	"bytes"
	"encoding/binary"
	"net"
	"strings"
	"testing"

	"vunet/test/guest"
)

var testMAC = net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}

func TestARPRequestAndReply(t *testing.T) {
	spa, tpa := net.IPv4(10, 0, 2, 15), net.IPv4(10, 0, 2, 2)
	req := arpRequestFrame(testMAC, spa, tpa)
	want := []byte{
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0, 0x12, 0x34, 0x56, 0x08, 0x06,
		0, 1, 0x08, 0, 6, 4, 0, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56, 10, 0, 2, 15,
		0, 0, 0, 0, 0, 0, 10, 0, 2, 2,
	}
	if !bytes.Equal(req, want) {
		t.Fatalf("request\n got % x\nwant % x", req, want)
	}
	if _, _, ok := parseARPReply(req); ok {
		t.Fatal("a request parsed as a reply")
	}
	// Turn it into the reply a responder would send.
	rep := append([]byte(nil), req...)
	theirs := net.HardwareAddr{0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55}
	copy(rep[0:6], testMAC)
	copy(rep[6:12], theirs)
	binary.BigEndian.PutUint16(rep[20:22], 2)
	copy(rep[22:28], theirs)
	copy(rep[28:32], tpa.To4())
	copy(rep[32:38], testMAC)
	copy(rep[38:42], spa.To4())
	sha, got, ok := parseARPReply(rep)
	if !ok || sha.String() != theirs.String() || !got.Equal(tpa) {
		t.Fatalf("reply parsed as %v %v %v", sha, got, ok)
	}
}

func TestProbeFrame(t *testing.T) {
	f := probeFrame(testMAC, []byte("VUNET-PROBE 3"))
	if binary.BigEndian.Uint16(f[12:14]) != guest.ProbeEtherType || !bytes.Equal(f[6:12], testMAC) ||
		!bytes.Equal(f[0:6], broadcastMAC) || string(f[14:]) != "VUNET-PROBE 3" {
		t.Fatalf("probe frame % x", f)
	}
}

// FuzzParseARPReply: the reply comes from the back-end under test, so the
// agent must not crash on whatever it sends.
func FuzzParseARPReply(f *testing.F) {
	f.Add(arpRequestFrame(testMAC, net.IPv4(1, 2, 3, 4), net.IPv4(5, 6, 7, 8)))
	f.Add([]byte{})
	f.Add(make([]byte, 41))
	f.Fuzz(func(t *testing.T, b []byte) {
		sha, spa, ok := parseARPReply(b)
		if ok && (len(sha) != 6 || len(spa) != 4) {
			t.Fatalf("reply with %d-byte MAC, %d-byte IP", len(sha), len(spa))
		}
	})
}

func TestParseIfInet6AndRoute(t *testing.T) {
	ifInet6 := `fd00000000000000505400fffe123456 02 40 00 00     eth0
fe80000000000000505400fffe123456 02 40 20 80     eth0
fd000000000000000000000000000099 02 40 00 40     eth0
00000000000000000000000000000001 01 80 10 80       lo
`
	addrs, plen := parseIfInet6(strings.NewReader(ifInet6), "eth0")
	if len(addrs) != 1 || addrs[0] != "fd00::5054:ff:fe12:3456" || plen != 64 {
		t.Errorf("global addresses %q /%d; want only the non-tentative fd00::5054:ff:fe12:3456/64", addrs, plen)
	}
	route := `fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe8000000000000000fc00fffe000001 00000400 00000001 00000000 00450003     eth0
`
	if r := parseIPv6Route(strings.NewReader(route), "eth0"); r != "fe80::fc:ff:fe00:1" {
		t.Errorf("default router %q", r)
	}
	if r := parseIPv6Route(strings.NewReader(route), "eth1"); r != "" {
		t.Errorf("router for another interface: %q", r)
	}
	if hexIPv6("zz") != nil || hexIPv6(strings.Repeat("g", 32)) != nil {
		t.Error("hexIPv6 accepted garbage")
	}
}

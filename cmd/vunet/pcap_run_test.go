package main

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/test/frontend"
)

// dhcpDiscoverFrame is a guest's DHCPDISCOVER, Ethernet onward, with
// extra options appended (each code, length, data).
func dhcpDiscoverFrame(t *testing.T, mac header.MAC, extra ...[]byte) []byte {
	t.Helper()
	const l2l3 = 14 + 20 + 8
	b := make([]byte, 1500)
	var w header.DHCPv4Builder
	w.Reset(b[l2l3:], &header.DHCPv4Fields{Op: 1, TransactionID: 0x5eed1e55, ClientMAC: mac})
	w.AddOptionByte(header.DHCPv4OptMessageType, uint8(header.DHCPDiscover))
	for _, o := range extra {
		w.AddOption(o[0], o[2:])
	}
	n, ok := w.Finish()
	if !ok {
		t.Fatal("building DHCPDISCOVER")
	}
	header.EncodeEthernet(b, header.BroadcastMAC, mac, header.EtherTypeIPv4)
	src, dst := netip.IPv4Unspecified(), netip.AddrFrom4([4]byte{255, 255, 255, 255})
	header.EncodeIPv4(b[14:], &header.IPv4Fields{TotalLength: uint16(20 + 8 + n), TTL: 64,
		Protocol: header.IPProtocolUDP, Source: src, Destination: dst})
	header.EncodeUDP(b[34:], 68, 67, uint16(8+n))
	header.UDP(b[34:34+8+n]).SetChecksum(src, dst)
	return b[:l2l3+n]
}

// pcapRecords parses a pcap file (LINKTYPE_ETHERNET, either timestamp
// resolution, little-endian as written on this machine).
func pcapRecords(t *testing.T, b []byte) [][]byte {
	t.Helper()
	if len(b) < 24 {
		t.Fatalf("pcap file of %d bytes", len(b))
	}
	magic := binary.LittleEndian.Uint32(b)
	if magic != 0xa1b2c3d4 && magic != 0xa1b23c4d {
		t.Fatalf("pcap magic %#x", magic)
	}
	if binary.LittleEndian.Uint16(b[4:]) != 2 || binary.LittleEndian.Uint16(b[6:]) != 4 ||
		binary.LittleEndian.Uint32(b[20:]) != 1 {
		t.Fatalf("pcap header %x", b[:24])
	}
	var recs [][]byte
	for r := b[24:]; len(r) > 0; {
		if len(r) < 16 {
			t.Fatalf("truncated record header (%d bytes left)", len(r))
		}
		incl, orig := binary.LittleEndian.Uint32(r[8:]), binary.LittleEndian.Uint32(r[12:])
		if incl != orig || int(incl) > len(r)-16 {
			t.Fatalf("record incl %d orig %d, %d bytes left", incl, orig, len(r)-16)
		}
		recs = append(recs, r[16:16+incl])
		r = r[16+incl:]
	}
	return recs
}

// TestPcapCapturesDHCPExchange runs the daemon with --pcap, plays a guest
// asking for an address through the in-process front-end, and reads the
// file back: it holds the exact DISCOVER and OFFER frames, and tshark
// finds the DHCP exchange in it.
func TestPcapCapturesDHCPExchange(t *testing.T) {
	dir := t.TempDir()
	sock, file := filepath.Join(dir, "v.sock"), filepath.Join(dir, "cap.pcap")
	d := startDaemon(t, "--vhost-user", "-f", "-1", "-s", sock, "--pcap", file,
		"-a", "10.0.2.15", "-n", "24", "-g", "10.0.2.2", "-4")
	d.waitMsg(t, "vunet starting", 10*time.Second)
	waitFile(t, sock)
	f := frontend.New(dialUnix(t, sock))
	defer f.Close()
	if err := f.Negotiate(frontend.Options{RingSize: 256}); err != nil {
		t.Fatal(err)
	}
	if err := f.PostRX(64, 2048); err != nil {
		t.Fatal(err)
	}
	mac := header.MAC{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	discover := dhcpDiscoverFrame(t, mac)
	if err := f.SubmitTX(discover); err != nil {
		t.Fatal(err)
	}
	var offer []byte
	deadline := time.Now().Add(5 * time.Second)
	for offer == nil && time.Now().Before(deadline) {
		frames, err := f.ReceiveRX(time.Second)
		if err != nil {
			continue
		}
		for _, fr := range frames {
			if len(fr.Data) > 42 && binary.BigEndian.Uint16(fr.Data[12:]) == 0x0800 &&
				fr.Data[23] == 17 && binary.BigEndian.Uint16(fr.Data[34:]) == 67 {
				offer = append([]byte(nil), fr.Data...)
			}
		}
	}
	if offer == nil {
		t.Fatal("no DHCPOFFER")
	}
	f.Stop()
	f.Close()
	if code, _ := d.exitCode(t, 5*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}

	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	recs := pcapRecords(t, b)
	var sawDiscover, sawOffer bool
	for _, r := range recs {
		sawDiscover = sawDiscover || bytes.Equal(r, discover)
		sawOffer = sawOffer || bytes.Equal(r, offer)
	}
	if !sawDiscover || !sawOffer {
		t.Fatalf("%d records; discover captured %v, offer captured %v", len(recs), sawDiscover, sawOffer)
	}

	tshark := needTool(t, "tshark", "tshark")
	out, err := exec.Command(tshark, "-r", file, "-Y", "dhcp", "-T", "fields", "-e", "dhcp.option.dhcp").CombinedOutput()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, out)
	}
	var types []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.Contains(l, "Running as") {
			types = append(types, l)
		}
	}
	if strings.Join(types, ",") != "1,2" {
		t.Fatalf("tshark DHCP message types %q, want DISCOVER then OFFER (1,2)\n%s", types, out)
	}
}

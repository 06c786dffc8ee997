package main

import (
	"testing"
)

// dhcp6TestReply is a REPLY as vunet sends it: server id, client id,
// Rapid Commit, IA_NA with fd07::15, one resolver.
func dhcp6TestReply(xid [3]byte) []byte {
	b := append([]byte{dhcp6Reply}, xid[:]...)
	b = dhcp6Option(b, dhcp6OptServerID, []byte{0, 3, 0, 1, 0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55})
	b = dhcp6Option(b, dhcp6OptRapid, nil)
	iaaddr := []byte{0xfd, 0x07, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x15, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	ia := dhcp6Option([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}, dhcp6OptIAAddr, iaaddr)
	b = dhcp6Option(b, dhcp6OptIANA, ia)
	return dhcp6Option(b, dhcp6OptDNS, []byte{0xfd, 0x07, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x53})
}

func TestParseDHCPv6Reply(t *testing.T) {
	xid := [3]byte{1, 2, 3}
	r, ok := parseDHCPv6Reply(dhcp6TestReply(xid), xid)
	if !ok || !r.OK || r.Fields["addr"] != "fd07::15" || r.Fields["dns"] != "fd07::53" || r.Fields["valid_lifetime"] != "4294967295" {
		t.Fatalf("parse = %v, %v", r, ok)
	}
	if _, ok := parseDHCPv6Reply(dhcp6TestReply(xid), [3]byte{9, 9, 9}); ok {
		t.Error("reply to another transaction accepted")
	}
	bad := dhcp6TestReply(xid)
	if r, ok := parseDHCPv6Reply(bad[:len(bad)-3], xid); !ok || r.OK {
		t.Errorf("truncated reply: %v, %v; want reported as failed", r, ok)
	}
}

func FuzzParseDHCPv6Reply(f *testing.F) {
	xid := [3]byte{1, 2, 3}
	f.Add(dhcp6TestReply(xid))
	f.Add([]byte{dhcp6Reply, 1, 2, 3, 0, 3, 0, 200})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, ok := parseDHCPv6Reply(b, xid)
		if ok && r.OK && r.Fields["addr"] == "" {
			t.Fatal("ok without an address")
		}
	})
}

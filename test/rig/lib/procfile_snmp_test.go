package rig

import "testing"

// snmp is /proc/net/snmp's IP, UDP and UdpLite tables as Linux 6.x prints
// them (abridged IP table).
const snmp = `Ip: Forwarding DefaultTTL InReceives
Ip: 2 64 118
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 114842 0 995 115837 995 0 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 0 7 0 0 0 0
`

// TestSNMPTable reads a field by its name in its own table: UDP's
// RcvbufErrors, not UdpLite's (the line that follows) nor a column of
// another table.
func TestSNMPTable(t *testing.T) {
	for _, c := range []struct {
		proto, field string
		want         int64
		ok           bool
	}{
		{"Udp", "RcvbufErrors", 995, true},
		{"Udp", "InDatagrams", 114842, true},
		{"UdpLite", "RcvbufErrors", 7, true},
		{"Ip", "InReceives", 118, true},
		{"Udp", "NoSuchField", 0, false},
		{"Tcp", "RcvbufErrors", 0, false},
	} {
		tab, err := SNMPTable([]byte(snmp), c.proto)
		got, found := tab[c.field]
		if (err == nil && found) != c.ok || got != c.want {
			t.Errorf("%s %s: %d, %v; want %d (found: %v)", c.proto, c.field, got, err, c.want, c.ok)
		}
	}
}

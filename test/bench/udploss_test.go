package main

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

// TestSNMPField reads a field by its name in its own table: UDP's
// RcvbufErrors, not UdpLite's (the line that follows) nor a column of
// another table.
func TestSNMPField(t *testing.T) {
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
		got, err := snmpField([]byte(snmp), c.proto, c.field)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("%s %s: %d, %v; want %d (found: %v)", c.proto, c.field, got, err, c.want, c.ok)
		}
	}
}

// TestLossNote: the note gives each namespace's drops over the row, and
// the ring's dry spells only where the back-end reports them both times;
// a counter one probe could not read is left out, not taken for zero.
func TestLossNote(t *testing.T) {
	before := lossProbe{hostFull: 10, guestFull: 3, hasHost: true, hasGuest: true, waits: 5, hasWaits: true}
	after := lossProbe{hostFull: 1184, guestFull: 3, hasHost: true, hasGuest: true, waits: 6, hasWaits: true}
	if got, want := lossNote(before, after), "receives dropped on full sockets: 1174 in the host namespace, 0 in the guest's; guest RX ring ran dry 1×"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	after.hasWaits = false
	if got, want := lossNote(before, after), "receives dropped on full sockets: 1174 in the host namespace, 0 in the guest's"; got != want {
		t.Errorf("without waits: got %q\nwant %q", got, want)
	}
	// The host namespace unreadable after the row (a lifetime total or a
	// negative count would pass for the row's).
	after.hasWaits = true
	after.hasHost = false
	if got, want := lossNote(before, after), "receives dropped on full sockets: 0 in the guest's; guest RX ring ran dry 1×"; got != want {
		t.Errorf("host unreadable: got %q\nwant %q", got, want)
	}
	if got := lossNote(lossProbe{}, lossProbe{}); got != "" {
		t.Errorf("nothing readable: got %q, want nothing", got)
	}
}

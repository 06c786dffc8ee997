package main

import "testing"

// TestLossNote: the note gives each namespace's drops over the row, and
// the ring's dry spells only where the back-end reports them both times;
// a counter one probe could not read is left out, not taken for zero.
func TestLossNote(t *testing.T) {
	before := lossProbe{hostFull: 10, guestFull: 3, hasHost: true, hasGuest: true, guestIf: 7, hasGuestIf: true, waits: 5, udpDrops: 2, hasWaits: true}
	after := lossProbe{hostFull: 1184, guestFull: 3, hasHost: true, hasGuest: true, guestIf: 29, hasGuestIf: true, waits: 6, udpDrops: 2, hasWaits: true}
	if got, want := lossNote(before, after), "receives dropped on full sockets: 1174 in the host namespace, 0 in the guest's; frames dropped by the guest namespace's interfaces: 22; dropped by the back-end: 0; guest RX ring ran dry 1×"; got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	after.hasWaits = false
	after.hasGuestIf = false
	if got, want := lossNote(before, after), "receives dropped on full sockets: 1174 in the host namespace, 0 in the guest's"; got != want {
		t.Errorf("without waits and interfaces: got %q\nwant %q", got, want)
	}
	// The host namespace unreadable after the row (a lifetime total or a
	// negative count would pass for the row's).
	after.hasWaits = true
	after.hasHost = false
	after.udpDrops = 9
	if got, want := lossNote(before, after), "receives dropped on full sockets: 0 in the guest's; dropped by the back-end: 7; guest RX ring ran dry 1×"; got != want {
		t.Errorf("host unreadable: got %q\nwant %q", got, want)
	}
	if got := lossNote(lossProbe{}, lossProbe{}); got != "" {
		t.Errorf("nothing readable: got %q, want nothing", got)
	}
}

// TestDevDrops sums the rx and tx drop columns of every interface but
// loopback, from a /proc/net/dev table as Linux 6.x prints it.
func TestDevDrops(t *testing.T) {
	dev := `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 147015454950 5863414    0    9    0     0          0         0 147015454950 5863414    0    9    0     0       0          0
  tap0: 1000 10 1 3 4 5 6 7 2000 20 8 40 9 10 11 12
  veth1:    0       0    0    2    0     0          0         0        0       0    0    0    0     0       0          0
`
	got, err := devDrops([]byte(dev))
	if err != nil {
		t.Fatal(err)
	}
	if got != 45 { // tap0: rx 3 + tx 40; veth1: rx 2; lo left out
		t.Errorf("devDrops = %d, want 45", got)
	}
	if _, err := devDrops([]byte("no table")); err == nil {
		t.Error("devDrops of a table without a header: no error")
	}
	if _, err := devDrops([]byte(dev + "  eth9: 1 2 3\n")); err == nil {
		t.Error("devDrops of a short line: no error")
	}
}

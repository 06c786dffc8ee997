package main

import "testing"

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

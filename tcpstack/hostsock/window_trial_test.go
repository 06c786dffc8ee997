package hostsock

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fieldsPrefix marks the line TestWindowReopens prints for a harness that
// runs this test binary elsewhere: the QEMU guest's gotest check reports
// its key=value words (guest.FieldsPrefix; the daemon's packages do not
// import the test tree).
const fieldsPrefix = "VUNET-FIELDS "

// trialSettle is how long the test waits for a window to reopen: longer
// than a sender's first zero-window probe (200 ms), so a window the kernel
// leaves shut is not mistaken for a slow one only if it stays shut past
// it.
const trialSettle = time.Second

// TestWindowReopens is the window experiment with and without the
// workaround, on whatever kernel runs it (the host's; e2e
// TestQEMUWindowReopenGuestKernel runs this binary inside a Debian 12
// guest). A remote sender fills the receive window of a socket dialled as
// vunet dials; vunet's sequence peeks the data (to the guest) and drops
// all of it (the guest's ACK). The assertion is the sender's reopened
// window — what it may send after the guest's ACK, and then does send:
//
//   - what the daemon does (the consume, plus the workaround only where
//     ProbeWindowKernel says the kernel needs it) reopens the window;
//   - the workaround after the consume never leaves the sender less than
//     the consume alone does (it cannot hurt in the form the daemon uses).
//
// The clamp taken at the zero window (the form that locks kernels from
// 5.15 to the 2023 fix) is run and reported, not asserted: it is the
// kernel's property, and the daemon never uses that form.
func TestWindowReopens(t *testing.T) {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	kernel := unix.ByteSliceToString(uts.Release[:])
	k := ProbeWindowKernel()
	if k.Err != nil {
		t.Fatalf("window probe: %v", k.Err)
	}
	trials := map[WindowMode]WindowTrial{}
	for _, m := range []WindowMode{WindowAlone, WindowClampAfter, WindowClampAtZero} {
		w, err := RunWindowTrial(m, trialSettle)
		if err != nil {
			t.Fatalf("%v: %v", m, err)
		}
		t.Logf("kernel %s: %v", kernel, w)
		trials[m] = w
	}
	alone, after, atZero := trials[WindowAlone], trials[WindowClampAfter], trials[WindowClampAtZero]
	daemon := alone
	if k.NeedsClamp() {
		daemon = after
	}
	t.Logf("probe: %v; the daemon applies the workaround: %v", k, k.NeedsClamp())
	fmt.Printf("%skernel=%s needs_clamp=%v filled=%d alone=%d alone_delivered=%d clamp_after=%d clamp_after_delivered=%d clamp_after_outcome=%v clamp_at_zero=%d clamp_at_zero_outcome=%v\n",
		fieldsPrefix, kernel, k.NeedsClamp(), alone.Filled, alone.Reopened, alone.Delivered,
		after.Reopened, after.Delivered, after.Clamp, atZero.Reopened, atZero.Clamp)
	if daemon.Reopened == 0 || daemon.Delivered < int(daemon.Reopened) {
		t.Errorf("after the guest's ACK the sender may send %d bytes and delivered %d: the window did not reopen",
			daemon.Reopened, daemon.Delivered)
	}
	if after.Reopened < alone.Reopened {
		t.Errorf("the workaround after the consume left the sender %d bytes, %d without it: it hurts on %s",
			after.Reopened, alone.Reopened, kernel)
	}
	if after.Clamp == ClampSkipped {
		t.Errorf("the workaround was not applied in the trial that forces it")
	}
	if atZero.Reopened == 0 {
		t.Logf("kernel %s: TCP_WINDOW_CLAMP taken at a zero window locks it (5.15 up to 58d3aade20cd)", kernel)
	}
}

// TestReapplyWindowClampNeverShrinks: the workaround's value is never
// below the socket's clamp, nor below the window it advertises, and never
// zero.
func TestReapplyWindowClampNeverShrinks(t *testing.T) {
	s, r, err := loopbackPair()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(s)
	defer unix.Close(r)
	var info unix.TCPInfo
	before, err := GetInt(r, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP)
	if err != nil || before <= 0 {
		t.Fatalf("clamp %d: %v", before, err)
	}
	v, out := ReapplyWindowClamp(r, &info)
	if out == ClampSkipped || v < before {
		t.Fatalf("applied %d (%v), clamp was %d", v, out, before)
	}
	n, _ := tcpInfoLen(r, &info)
	if n >= rcvWndEnd && v < int(info.Rcv_wnd) {
		t.Fatalf("applied %d below the advertised window %d", v, info.Rcv_wnd)
	}
	if after, _ := GetInt(r, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP); after != v {
		t.Fatalf("socket's clamp %d after the call, it reported setting %d (was %d)", after, v, before)
	}
}

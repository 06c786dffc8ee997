package hostsock

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The window workaround (DESIGN invariant 4): after a guest ACK lets vunet
// drop bytes it had only peeked (Discard, MSG_TRUNC), the host socket's
// receive window should reopen towards the remote sender. passt found a
// stall on Linux 6.5 where it did not, and that setting TCP_WINDOW_CLAMP
// afterwards, even to the clamp already set, made it reopen (passt
// d3192f67, "tcp: Force TCP_WINDOW_CLAMP before resetting STALLED flag",
// Sep 2023); two months later passt removed every use of the option
// (cf3eeba, "tcp: Don't use TCP_WINDOW_CLAMP") because of what it does to
// an established socket. Kernel by kernel (net/ipv4/tcp.c,
// tcp_set_window_clamp):
//
//   - Before 5.15 it only sets window_clamp, an upper bound; the window a
//     socket advertises is computed from free space and rcv_ssthresh, which
//     the option leaves alone. Re-applied at or above the current clamp
//     it is a no-op.
//   - 5.15 (3aa7857fe1d7, "tcp: enable mid stream window clamp", Aug 2021)
//     up to the fix below: every call, even with the clamp unchanged, sets
//     rcv_ssthresh = min(rcv_wnd, clamp). Taken while the socket
//     advertises a zero window (rcv_wnd 0) it sets rcv_ssthresh to 0, and
//     the window never reopens, however much the application reads: it
//     HURTS (the podman and passt stalls of 2023). Taken once the window
//     is open again it can lift a depressed rcv_ssthresh back to the
//     window last advertised, which is what passt saw help on 6.5, or
//     lower it to that window, which slows its regrowth.
//   - 6.7 (58d3aade20cd, "tcp: fix mid stream window clamp", Dec 2023),
//     backported to 6.6.y and 6.1.y stable in Dec 2023 (Debian 12's
//     6.1.192 has it), and every later kernel: an unchanged clamp returns
//     at once, a larger one only raises rcv_ssthresh up to
//     min(rcv_wnd, clamp), a smaller one shrinks it. Re-applied at or
//     above the current clamp it is a no-op or a harmless raise.
//
// No kernel sends anything when the option is set: at best it changes
// the window the next ACK computes. Measured with WindowTrial (a loopback
// pair filled to a zero window, peeked, then consumed as a guest ACK
// makes vunet do), on 6.18 and on Debian 12's 6.1.192 in a QEMU guest
// (TestWindowReopens, e2e TestQEMUWindowReopenGuestKernel): the consume
// alone reopens the sender's window (95232 and 65536 bytes), the clamp
// after it changes nothing, and the clamp taken at the zero window does
// not lock it. The workaround is applied only where ProbeWindowKernel
// finds the consume alone does not reopen the window and the clamp after
// it does; on every kernel measured here it is skipped.

// ClampOutcome is what one application of the window workaround did.
type ClampOutcome uint8

const (
	// ClampSkipped: not applied (no clamp to re-apply, or the option
	// could not be set).
	ClampSkipped ClampOutcome = iota
	// ClampNoEffect: applied; the receive window state the kernel
	// computes the next window from (rcv_ssthresh, rcv_wnd) did not move.
	ClampNoEffect
	// ClampEffective: applied, and rcv_ssthresh or the advertised window
	// grew.
	ClampEffective
)

func (o ClampOutcome) String() string {
	switch o {
	case ClampSkipped:
		return "skipped"
	case ClampNoEffect:
		return "no-effect"
	case ClampEffective:
		return "effective"
	}
	return "?"
}

// rcvWndEnd is how long struct tcp_info must be for tcpi_rcv_wnd (Linux
// 6.2 and later) to be there.
var rcvWndEnd = uint32(unsafe.Offsetof(unix.TCPInfo{}.Rcv_wnd) + unsafe.Sizeof(unix.TCPInfo{}.Rcv_wnd))

// tcpInfoLen reads TCP_INFO into info, zeroed first so that fields the
// kernel does not know stay 0, and returns how many bytes it filled.
func tcpInfoLen(fd int, info *unix.TCPInfo) (uint32, bool) {
	*info = unix.TCPInfo{}
	l := uint32(unsafe.Sizeof(*info))
	_, _, e := unix.RawSyscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(info)), uintptr(unsafe.Pointer(&l)), 0)
	return l, e == 0
}

// ReapplyWindowClamp is the window workaround, in the one form that can
// reopen a window and cannot shrink it: on fd, a TCP socket whose receive
// queue the caller has just shrunk with Discard, it sets TCP_WINDOW_CLAMP
// to the socket's current clamp, raised to the window the socket last
// advertised where the kernel reports it (tcpi_rcv_wnd) — never below
// either, never zero. It returns the clamp set and what it did, read back
// from TCP_INFO; info is scratch space.
//
// Callers decide whether the kernel needs it (ProbeWindowKernel): on the
// kernels between 5.15 and the 2023 fix a clamp taken while the window is
// still zero locks it there.
func ReapplyWindowClamp(fd int, info *unix.TCPInfo) (clamp int, out ClampOutcome) {
	cur, err := GetInt(fd, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP)
	if err != nil || cur <= 0 {
		return 0, ClampSkipped
	}
	n, ok := tcpInfoLen(fd, info)
	if !ok {
		return 0, ClampSkipped
	}
	haveWnd := n >= rcvWndEnd
	ssthresh, wnd := info.Rcv_ssthresh, info.Rcv_wnd
	v := cur
	if haveWnd && int(wnd) > v {
		v = int(wnd)
	}
	if SetInt(fd, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, v) != nil {
		return 0, ClampSkipped
	}
	if _, ok := tcpInfoLen(fd, info); ok && (info.Rcv_ssthresh > ssthresh || (haveWnd && info.Rcv_wnd > wnd)) {
		return v, ClampEffective
	}
	return v, ClampNoEffect
}

package tcp

import (
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
)

// System calls a connection's pass can skip.
//
// Under a QEMU guest the back-end's CPU goes mostly to the kernel: its
// own system calls, the wake-ups they cause and the context switches
// around its sleeps. A download pass (the guest sends only ACKs) used to
// read TCP_INFO and SO_MEMINFO for a window towards the guest that could
// not have changed, and an upload pass (the host sends nothing) peeked a
// socket that had nothing, for EAGAIN. Two hints on the connection skip
// them, each false when in doubt (a handed-over connection starts with
// both false):
//
//   - drained: the last read emptied the socket. Host sockets are watched
//     edge-triggered, and every arrival is an edge, so until EPOLLIN
//     (HandleSocketEvent) there is nothing to read. A rewind makes the
//     data in flight readable again and clears it, and so does EPOLLIN
//     coming back after a mask (updateEpoll), as arrivals during the mask
//     went unreported.
//   - sendIdle: the last ACK/window refresh found nothing queued (where
//     ACKs follow our writes: less than a segment, with four segments of
//     window open, queuedIdle) and everything acknowledged, with a window
//     that neither the peer, the ring budget nor a full buffer held down
//     (refreshAckWnd).
//
// A short connection (connect, a request and its answer, close: the rig's
// connection-rate test) paid seven getsockopt calls for its ACKs and
// windows, and needs two; of its three epoll_ctl calls it needs the
// first: no mask after both FINs (epollWant), no EPOLL_CTL_DEL when the
// socket is ours alone (conn.sole, teardown.go). refreshAckWnd reads only
// what its decision needs:
//
//   - TCP_INFO that settleLocalConnect read for the SYN is the SYN-ACK's
//     (takeConnectInfo): the two reads were one pass apart, with nothing
//     written to the socket between them.
//   - The SYN-ACK's window stands for the request (wndHolds): nothing was
//     written before it, and the peer's window only made it smaller.
//   - After the guest's FIN nothing more comes from the guest: its ACK is
//     everything, and a window it cannot use is not worth two reads
//     (finAckWnd).
//
// What stays, and why. SO_MEMINFO in the SYN-ACK's window: the kernel
// sizes a new connection's send buffer from the path's MSS
// (tcp_sndbuf_expand; on this machine's kernel 69,120 bytes over a
// 1,500-byte MTU veth, a 34,560-byte window, below the 65,535 a SYN-ACK
// may carry; 3.9 MB on loopback), so no constant stands in for it. And
// TCP_INFO beside SO_MEMINFO for a local peer, whose ACKs follow our
// writes: the bytes still queued (tcpi_bytes_acked) measure sendSpace's
// payload ratio, and must be read first (refreshAckWnd says why), so
// SO_MEMINFO cannot first tell that none are.

// queuedIdle reports whether a refresh that found queued bytes (not yet
// acknowledged by the peer) in f's socket may still count the send side
// idle. Where ACKs follow our writes (a local peer, or Config.AckOnWrite)
// the ACK number does not depend on the peer, and the window can only grow
// as the peer acknowledges what is queued (by those bytes and their skb's
// overhead). The window the next frames carry is the smaller one the
// refresh found, as on any pass that does not refresh: when an exchange's
// request starts to be acknowledged with the answer (the peer left
// quick-ACK mode), the right edge the guest sees moves back once by the
// request's buffer charge (a few hundred bytes), then advances again.
// Less than a segment queued and at least four segments of window open:
// the guest is not held back by not hearing of that growth, and its next
// segment refreshes. That is a request/response exchange's case: the
// request is still queued when its write's refresh reads the socket, and
// the pass that sent the answer read TCP_INFO and SO_MEMINFO again, only
// to find the request acknowledged.
func (f *conn) queuedIdle(queued int, wnd uint32, peerAcks bool) bool {
	mss := f.guestMSS()
	return !peerAcks && uint32(queued) < mss && wnd >= 4*mss
}

// ackWndCurrent reports whether the last refreshAckWnd still holds, which
// saves its two getsockopt calls on every pass of a download (the guest
// sends only ACKs): the send side was idle then, the guest sent nothing
// since, no delayed-ACK check asks, and it is not sndBufRefresh old (the
// send buffer's size is re-read that often in any case).
func (t *Table) ackWndCurrent(now time.Time, f *conn) bool {
	return f.sendIdle && f.seqFromGuest == f.seqAckToGuest && f.flags&(flAckCheck|flWantOut) == 0 &&
		now.Sub(f.sndBufAt) < sndBufRefresh
}

// wndHolds reports whether the window the last refreshAckWnd opened still
// stands for this pass, and if so moves the ACK to everything the guest
// sent and gives the guest the rest of that window, which saves the
// refresh's TCP_INFO and SO_MEMINFO on most passes of an upload: a guest
// sending to a local peer (its ACKs follow our writes) had both read after
// every batch of its data, two getsockopt calls beside each sendmsg.
//
// The refresh's window is the payload the socket takes: the guest's data
// since came out of it, and its right edge stays where it was
// (ackAllKeepingEdge, as for any ACK moved without a refresh), so the
// guest never has more in flight than the socket takes (DESIGN
// invariant 5). A window that only shrinks would hold the guest back once
// it ran low, so the refresh comes back when less than half of it, or
// less than two segments, is left: the guest still has that much to send
// while the kernel drains, and the data that took the window below the
// mark is what brings the refresh, which announces the window the drained
// socket has (and arms EPOLLOUT when the kernel calls it full). A guest
// that stops sending with more left is not held back by the window.
//
// The window stands only where the refresh's decision needed nothing the
// pass could change: ACKs that follow our writes (for a remote peer the
// ACK is the peer's, from TCP_INFO), a socket the kernel did not call
// full, no EPOLLOUT wanted, no kept data, no ring budget, and not after
// the guest's FIN (finAckWnd) or a delayed-ACK check (flAckCheck), nor
// once sndBufRefresh old.
func (t *Table) wndHolds(now time.Time, f *conn) bool {
	if f.wndEdgeSpan == 0 || f.flags&(flAckCheck|flWantOut) != 0 || now.Sub(f.sndBufAt) >= sndBufRefresh ||
		f.has(evGuestFin) || f.oooReady() || t.txRing != 0 {
		return false
	}
	left := f.seqAckToGuest + f.wndToGuest - f.seqFromGuest
	if int32(left) < 0 || left < f.wndEdgeSpan/2 || left < 2*f.guestMSS() {
		return false
	}
	f.ackAllKeepingEdge()
	return true
}

// ackAllKeepingEdge moves the ACK to everything the guest sent without a
// look at the socket (no refresh): the window shrinks by what the move
// covers, so its right edge stays where the last refresh put it and the
// guest never has more in flight than that refresh found room for.
// Moving the ACK alone moved the edge on by that data: every ACK after a
// hole announced a segment more than the socket had room for (found by
// review; TestTCPGapKeepsWindowEdge).
func (f *conn) ackAllKeepingEdge() {
	edge := f.seqAckToGuest + f.wndToGuest
	f.seqAckToGuest = f.seqFromGuest
	f.wndToGuest = 0
	if seqGT(edge, f.seqFromGuest) {
		f.wndToGuest = edge - f.seqFromGuest
	}
}

// readInfo reads TCP_INFO of f's socket into t.info (counted in
// infoReads); nil when it could not.
func (t *Table) readInfo(f *conn) *unix.TCPInfo {
	t.infoReads++
	if !hostsock.TCPInfo(f.fd, &t.info) {
		return nil
	}
	return &t.info
}

// readMemory reads SO_MEMINFO of f's socket (counted in memReads): the
// send buffer's limit and the memory its queues take.
func (t *Table) readMemory(f *conn) (sndbuf, queued int, ok bool) {
	t.memReads++
	return hostsock.SendMemory(f.fd)
}

// keepConnectInfo keeps t.connectInfo, just read by settleLocalConnect,
// for f's SYN-ACK in this output pass.
func (t *Table) keepConnectInfo(f *conn) {
	t.connectInfoFor = f.ref()
}

// takeConnectInfo returns the TCP_INFO settleLocalConnect read for f in
// this pass, once, or nil.
func (t *Table) takeConnectInfo(f *conn) *unix.TCPInfo {
	if t.connectInfoFor.gen == 0 || t.connectInfoFor != f.ref() {
		return nil
	}
	t.connectInfoFor = flowRef{}
	return &t.connectInfo
}

// dropConnectInfo forgets a TCP_INFO kept for a SYN-ACK that did not go
// in its pass (no RX buffer): by the next pass the peer may have sent.
func (t *Table) dropConnectInfo() { t.connectInfoFor = flowRef{} }

// finAckWnd is refreshAckWnd once the guest's FIN was taken (in order:
// everything before it is written): the ACK is everything the guest sent,
// and the window, which it cannot use any more, stays as it was: no
// TCP_INFO, no SO_MEMINFO. EPOLLOUT, wanted for a window update, is not
// wanted any more; data kept out of order that waits for the socket's
// room keeps it (the caller does not come here then).
func (t *Table) finAckWnd(f *conn) {
	f.seqAckToGuest = f.seqFromGuest
	f.sendIdle = false
	if f.flags&flWantOut != 0 {
		f.flags &^= flWantOut | flOutArmed
		t.updateEpoll(f)
	}
}

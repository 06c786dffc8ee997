package tcp

import "time"

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
//     coming back after a mask (setEpoll), as arrivals during the mask
//     went unreported.
//   - sendIdle: the last ACK/window refresh found nothing queued and
//     everything acknowledged, with a window that neither the peer, the
//     ring budget nor a full buffer held down (refreshAckWnd).

// ackWndCurrent reports whether the last refreshAckWnd still holds, which
// saves its two getsockopt calls on every pass of a download (the guest
// sends only ACKs): the send side was idle then, the guest sent nothing
// since, no delayed-ACK check asks, and it is not sndBufRefresh old (the
// send buffer's size is re-read that often in any case).
func (t *Table) ackWndCurrent(now time.Time, f *conn) bool {
	return f.sendIdle && f.seqFromGuest == f.seqAckToGuest && f.flags&flAckCheck == 0 &&
		now.Sub(f.sndBufAt) < sndBufRefresh
}

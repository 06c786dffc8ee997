package tcp

import (
	"time"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"

	"golang.org/x/sys/unix"
)

// HandleSocketEvent handles epoll events for the socket registered with
// token. It only changes state and queues output; the loop's next Flush
// writes the frames. Stale tokens (a connection closed earlier in the same
// epoll batch) are ignored.
func (t *Table) HandleSocketEvent(now time.Time, token hostsock.Token, events uint32) {
	if token.Owner() == hostsock.OwnerTCPListener {
		t.accept(now, int(token.Slot()))
		return
	}
	f := t.flowByToken(token)
	if f == nil || f.fd < 0 {
		return
	}
	f.lastActivity = now
	if f.flags&flConnected == 0 {
		if events&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) == 0 {
			return
		}
		soErr, err := hostsock.GetInt(f.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil || soErr != 0 || events&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
			why := stats.TCPError
			if soErr != 0 {
				why = connectReason(unix.Errno(soErr))
			}
			t.log.Debug("tcp connect failed", "remote", f.remoteAddr, "port", f.remotePort, "err", unix.Errno(soErr))
			t.connectFailed(f, now, why)
			return
		}
		t.connected(f)
		t.updateEpoll(f)
		t.noteDeadline(f)
		return
	}
	if events&unix.EPOLLERR != 0 {
		soErr, _ := hostsock.GetInt(f.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		t.log.Debug("tcp host socket error", "err", unix.Errno(soErr))
		why := stats.TCPError
		if soErr != 0 {
			why = resetReason(unix.Errno(soErr))
		}
		t.resetFlow(f, now, why)
		return
	}
	if events&unix.EPOLLOUT != 0 {
		// Send space freed up: the window to the guest may have reopened
		// (the output pass decides whether that is worth an update). The
		// wake-up cleared SOCK_NOSPACE: the next full spell polls again.
		f.flags &^= flOutArmed
		t.markDirty(f) // the output pass also writes data kept out of order
	}
	if events&(unix.EPOLLRDHUP|unix.EPOLLHUP) != 0 {
		f.events |= evSockRdHup
	}
	if events&unix.EPOLLPRI != 0 {
		f.urgent = true
	}
	if events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLPRI) != 0 {
		// The output pass reads (or finds EOF, or the error behind HUP).
		f.drained = false
		t.markDirty(f)
	}
	t.noteDeadline(f)
}

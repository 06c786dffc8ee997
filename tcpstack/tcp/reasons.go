package tcp

import (
	"errors"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/stats"
)

// Why connections fail or are reset, from the errors the host sockets
// report, in the counters' vocabulary (stats.TCPReason).

// connectReason is why a host connect() failed with err.
func connectReason(err error) stats.TCPReason {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return stats.TCPError
	}
	switch errno {
	case unix.ECONNREFUSED, unix.ECONNRESET:
		return stats.TCPRefused
	case unix.ENETUNREACH, unix.EHOSTUNREACH, unix.ENETDOWN, unix.EHOSTDOWN:
		return stats.TCPUnreachable
	case unix.ETIMEDOUT:
		return stats.TCPTimeout
	}
	return stats.TCPError
}

// resetReason is why a connection is reset after a socket call failed
// with err.
func resetReason(err error) stats.TCPReason {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return stats.TCPError
	}
	switch errno {
	case unix.ECONNRESET, unix.EPIPE, unix.ECONNREFUSED, unix.ECONNABORTED:
		return stats.TCPHostReset
	case unix.ETIMEDOUT:
		return stats.TCPTimeout
	}
	return stats.TCPError
}

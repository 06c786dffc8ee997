package stats

import "sync/atomic"

// Stream counts the stream transport (QEMU's -netdev stream: frames with
// a 4-byte length on a UNIX stream socket, passt without --vhost-user).
// The frames themselves are counted in Queue.TX and Queue.RX like a
// queue pair's; these are the socket's own events.
type Stream struct {
	// Sessions counts connections served.
	Sessions atomic.Uint64
	// Reads and Writes count recv and sendmsg calls that moved bytes;
	// ReadBytes and WriteBytes the bytes, length prefixes included.
	Reads, Writes         atomic.Uint64
	ReadBytes, WriteBytes atomic.Uint64
	// WriteWaits counts writes that stopped short (the socket's buffer
	// was full: EAGAIN or a partial write): the rest waits for EPOLLOUT.
	WriteWaits atomic.Uint64
	// BadLength counts connections closed because a frame's length was
	// out of bounds (shorter than an Ethernet header or longer than the
	// largest frame): the stream cannot be resynchronised after it.
	BadLength atomic.Uint64
	// Truncated counts connections whose peer closed inside a frame.
	Truncated atomic.Uint64
	// WriteErrors counts connections ended by a failed write (the peer
	// reset the connection).
	WriteErrors atomic.Uint64
}

package tcpstack

import (
	"context"
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stream"
	"vunet/virtqueue"
)

// The stream transport: QEMU's -netdev stream (passt without
// --vhost-user) reaches the guest over one UNIX stream socket instead of
// a queue pair's rings. The loop is the same one: frames read off the
// socket go through handleTXFrame like TX chains, and the producers write
// frames for the guest into the stream's send buffer (stream.Writer, a
// guestring.Sink) instead of RX buffers. Only the I/O below the frame
// differs.

// streamReadsPerIteration bounds the reads of one loop iteration, so a
// guest that never stops sending cannot starve the host sockets.
const streamReadsPerIteration = 8

// streamSockBuf is what the stream socket's SO_RCVBUF and SO_SNDBUF are
// asked to be (passt asks INT_MAX/2): the kernel caps it at
// net.core.rmem_max and wmem_max. Tests make it small.
var streamSockBuf = 1 << 30

// streamLink is a loop's stream socket: the framing both ways and why
// the session ended.
type streamLink struct {
	fd      int
	r       stream.Reader
	w       stream.Writer
	chain   virtqueue.Chain // a frame read, as a one-buffer chain for handleTXFrame
	iov     [1][]byte
	watched uint32 // the epoll events registered
	done    bool
	err     error // why the connection was dropped (nil: the peer closed it)
}

// ErrStreamTruncated is a peer that closed the connection inside a frame.
var ErrStreamTruncated = errors.New("stream closed inside a frame")

// ServeStream serves the guest over fd, a connected UNIX stream socket
// speaking QEMU's -netdev stream protocol, as queue pair 0, until the peer
// closes it, breaks the protocol (a frame length out of bounds), a write
// fails or ctx ends. The session then ends as a vhost-user front-end's
// does (EndSession): flows closed, TCP peers reset. fd stays the caller's
// to close. ServeStream returns nil when the peer closed the connection
// between frames or ctx ended, otherwise why the connection was dropped.
// A Stack serves either queue pairs or one stream at a time.
func (s *Stack) ServeStream(ctx context.Context, fd int) error {
	// Large socket buffers, as passt: frames queue in the kernel rather
	// than in our send buffer, and the peer's bursts in ours.
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, streamSockBuf)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, streamSockBuf)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("serve stream: %w", ErrClosed)
	}
	if _, ok := s.loops[0]; ok {
		s.mu.Unlock()
		return fmt.Errorf("serve stream: %w", ErrPairRunning)
	}
	ps, err := s.pairStateLocked(0)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("serve stream: %w", err)
	}
	sl := s.streamLink
	if sl == nil {
		// Kept for the next connection: the buffers are allocated once.
		sl = new(streamLink)
		sl.r.Init(stream.ReadBufSize)
		s.streamLink = sl
	}
	sl.reset(fd, ps, s)
	qp := virtqueue.QueuePair{Index: 0, RXEnabled: true, TXEnabled: true}
	l, err := newLoop(s, qp, ps, sl)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("serve stream: %w", err)
	}
	ps.st.LoopStarts.Add(1)
	ps.st.Stream.Sessions.Add(1)
	s.loops[0] = l
	reserveP(1) // run counts it out, as a queue pair's loop
	go l.run()
	s.mu.Unlock()
	s.log.Debug("stream session started", "fd", fd)

	select {
	case <-l.done:
	case <-ctx.Done():
	}
	s.StopPair(0)
	<-l.done // stopped by whoever took it from s.loops (Close may have)
	s.EndSession()
	return sl.err
}

// reset readies sl for a new connection on fd.
func (sl *streamLink) reset(fd int, ps *pairState, s *Stack) {
	sl.fd = fd
	sl.r.Reset()
	sl.w.Init(fd, stream.SendBufSize, ps.st, s.log)
	sl.watched = 0
	sl.done, sl.err = false, nil
}

// ended reports whether the session is over (nil for a queue pair's loop).
func (sl *streamLink) ended() bool { return sl != nil && sl.done }

// end ends the session; err says why (nil: the peer closed).
func (sl *streamLink) end(err error) {
	if !sl.done {
		sl.done, sl.err = true, err
	}
}

// event takes the socket's epoll events: EPOLLOUT writes what waited;
// it reports whether there is something to read (or a hang-up or error
// to find out about by reading).
func (sl *streamLink) event(ev uint32) (read bool) {
	if ev&unix.EPOLLOUT != 0 {
		sl.w.Writable()
	}
	return ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0
}

// settle, after the iteration's writes, ends the session on a failed
// write and otherwise watches the socket for what the writer waits for.
func (sl *streamLink) settle(ep *hostsock.Epoll) {
	if err := sl.w.Err(); err != nil {
		sl.end(fmt.Errorf("stream write: %w", err))
		return
	}
	if err := sl.watch(ep); err != nil {
		sl.end(err)
	}
}

// watch registers the socket for input, and for output while frames
// wait for it to drain.
func (sl *streamLink) watch(ep *hostsock.Epoll) error {
	want := uint32(unix.EPOLLIN | unix.EPOLLRDHUP)
	if sl.w.Blocked() {
		want |= unix.EPOLLOUT
	}
	if want == sl.watched {
		return nil
	}
	tok := hostsock.NewToken(hostsock.OwnerLoop, 0, loopFDStream)
	var err error
	if sl.watched == 0 {
		err = ep.Add(sl.fd, want, tok)
	} else {
		err = ep.Mod(sl.fd, want, tok)
	}
	if err != nil {
		return fmt.Errorf("epoll stream socket: %w", err)
	}
	sl.watched = want
	return nil
}

// streamTX reads frames off the stream socket and dispatches each as a TX
// frame. After each read that filled the buffer (more may wait) the
// frames produced for the guest go out before the next read, as after a
// full TX batch. It returns true when the iteration's budget ran out with
// data perhaps left.
func (l *loop) streamTX() (more bool) {
	sl := l.stream
	st := &l.st.Stream
	for b := 0; b < streamReadsPerIteration && !sl.done; b++ {
		n, err := sl.r.Read(sl.fd)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return false
		case errors.Is(err, io.EOF):
			if sl.r.Buffered() > 0 {
				st.Truncated.Add(1)
				sl.end(fmt.Errorf("%w (%d bytes of it read)", ErrStreamTruncated, sl.r.Buffered()))
			} else {
				sl.end(nil)
			}
			return false
		case err != nil:
			sl.end(fmt.Errorf("stream read: %w", err))
			return false
		}
		st.Reads.Add(1)
		st.ReadBytes.Add(uint64(n))
		for {
			frame, err := sl.r.Next()
			if err != nil {
				l.flushSends()
				st.BadLength.Add(1)
				sl.end(err)
				return false
			}
			if frame == nil {
				break
			}
			sl.iov[0] = frame
			sl.chain.Readable = sl.iov[:]
			l.handleTXFrame(&sl.chain)
		}
		// The datagrams queued for sendmmsg point into the read buffer,
		// which the next read reuses.
		l.flushSends()
		sl.chain.Readable, sl.iov[0] = nil, nil
		l.deliverPending()
		if !sl.r.Full() {
			return false // the socket had no more: epoll says when it has
		}
		l.tcpOutput()
		l.out.Publish()
	}
	return !sl.done
}

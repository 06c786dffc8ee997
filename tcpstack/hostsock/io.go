package hostsock

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// MaxIovecs bounds the buffers of one sendmsg or recvmsg (Linux UIO_MAXIOV);
// a longer list is cut there.
const MaxIovecs = 1024

// IO does socket I/O straight from and into guest memory. It holds the
// iovec array and msghdr the system calls take, so that none is allocated
// per call; one IO belongs to one goroutine.
type IO struct {
	iov [MaxIovecs]unix.Iovec
	msg unix.Msghdr
}

// setIovecs points the iovec array at bytes [off, off+n) of the
// concatenated bufs (see fillIovecs) and returns how many entries it used.
func (s *IO) setIovecs(bufs [][]byte, off, n int) (k int) { return fillIovecs(s.iov[:], bufs, off, n) }

// fillIovecs points iov at bytes [off, off+n) of the concatenated bufs,
// skipping empty ones, and returns how many entries it used (fewer bytes
// than n if the buffers or iov end first).
func fillIovecs(iov []unix.Iovec, bufs [][]byte, off, n int) (k int) {
	for _, b := range bufs {
		if n <= 0 || k == len(iov) {
			break
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		b = b[off:]
		off = 0
		if len(b) > n {
			b = b[:n]
		}
		iov[k].Base = &b[0]
		iov[k].SetLen(len(b))
		k++
		n -= len(b)
	}
	return k
}

func (s *IO) setMsg(k int) {
	s.msg = unix.Msghdr{}
	if k > 0 {
		s.msg.Iov = &s.iov[0]
		s.msg.SetIovlen(k)
	}
}

// Send sends bytes [off, off+n) of the concatenated bufs on the connected
// socket fd, as one datagram or stream write (a zero-length datagram for
// n == 0), without blocking and without SIGPIPE. It returns the bytes sent.
func (s *IO) Send(fd int, bufs [][]byte, off, n int) (int, error) {
	if faultsEnabled {
		if err := injectedFault(faultSend); err != nil {
			return 0, err
		}
	}
	s.setMsg(s.setIovecs(bufs, off, n))
	return s.call(unix.SYS_SENDMSG, fd, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
}

// Recv receives one datagram (or what a stream has) into bufs without
// blocking, flags added to MSG_DONTWAIT, and returns its length and the
// msghdr flags (unix.MSG_TRUNC: it did not fit).
func (s *IO) Recv(fd int, bufs [][]byte, flags int) (n, msgFlags int, err error) {
	s.setMsg(s.setIovecs(bufs, 0, int(^uint(0)>>1)))
	n, err = s.call(unix.SYS_RECVMSG, fd, flags|unix.MSG_DONTWAIT)
	return n, int(s.msg.Flags), err
}

// Peek reads a stream socket's queued bytes into bufs and leaves them
// queued (MSG_PEEK; from the peek offset when SO_PEEK_OFF is set). With no
// buffer to fill it reads nothing and returns 0.
func (s *IO) Peek(fd int, bufs [][]byte) (int, error) {
	k := s.setIovecs(bufs, 0, int(^uint(0)>>1))
	if k == 0 {
		return 0, nil
	}
	if faultsEnabled {
		if err := injectedFault(faultPeek); err != nil {
			return 0, err
		}
	}
	s.setMsg(k)
	return s.call(unix.SYS_RECVMSG, fd, unix.MSG_PEEK|unix.MSG_DONTWAIT)
}

// RecvFrom is Recv that also stores the sender's address in from.
func (s *IO) RecvFrom(fd int, bufs [][]byte, from *unix.RawSockaddrAny) (n, msgFlags int, err error) {
	s.setMsg(s.setIovecs(bufs, 0, int(^uint(0)>>1)))
	s.msg.Name = (*byte)(unsafe.Pointer(from))
	s.msg.Namelen = uint32(unsafe.Sizeof(*from))
	n, err = s.call(unix.SYS_RECVMSG, fd, unix.MSG_DONTWAIT)
	s.msg.Name = nil
	return n, int(s.msg.Flags), err
}

// call runs sendmsg or recvmsg on s.msg, again after EINTR.
func (s *IO) call(trap uintptr, fd, flags int) (int, error) {
	for {
		r, _, e := unix.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&s.msg)), uintptr(flags))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(r), nil
	}
}

// Discard drops n bytes from the front of a stream socket's receive queue
// without copying them (recv with MSG_TRUNC). The kernel moves SO_PEEK_OFF
// back by as much. A TCP read stops at an urgent mark once it has taken
// anything, so it reads on from there until it has dropped n bytes, the
// queue is empty or an error comes; it returns what it dropped.
//
// A read that starts at the mark fails with EAGAIN while a signal is
// pending, with data queued (tcp_recvmsg; Go's runtime signals its threads
// to preempt them): the signal is handled on the way out, and the read is
// tried again, a few times, as the callers drop only bytes they peeked.
func Discard(fd, n int) (int, error) {
	done, again := 0, 0
	for done < n {
		r, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), 0, uintptr(n-done), unix.MSG_TRUNC|unix.MSG_DONTWAIT, 0, 0)
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN && again < 3:
			again++
			continue
		case e == unix.EAGAIN && done > 0:
			return done, nil
		case e != 0:
			return done, e
		case r == 0:
			return done, nil
		}
		done += int(r)
		again = 0
	}
	return done, nil
}

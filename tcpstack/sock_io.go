package tcpstack

import (
	"unsafe"

	"vunet/tcpstack/hostsock"

	"golang.org/x/sys/unix"
)

// sockIO does socket I/O straight from and into guest memory with
// preallocated iovec and msghdr storage: x/sys/unix's Sendmsg/Recvmsg
// wrappers allocate per call.
type sockIO struct {
	iov [hostsock.MaxIovecs]unix.Iovec
	msg unix.Msghdr
}

// setIovecs points the iovec array at the bytes [off, off+n) of the
// concatenated buffers and returns how many entries it used and the bytes
// covered (less than n if the buffers end first or the array is full).
func (s *sockIO) setIovecs(bufs [][]byte, off, n int) (k, covered int) {
	for _, b := range bufs {
		if n == 0 || k == len(s.iov) {
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
		s.iov[k].Base = &b[0]
		s.iov[k].SetLen(len(b))
		k++
		n -= len(b)
		covered += len(b)
	}
	return k, covered
}

func (s *sockIO) setMsg(k int) {
	s.msg = unix.Msghdr{}
	if k > 0 {
		s.msg.Iov = &s.iov[0]
		s.msg.SetIovlen(k)
	}
}

// send sends bytes [off, off+n) of bufs as one datagram (or stream write)
// on the connected socket fd.
func (s *sockIO) send(fd int, bufs [][]byte, off, n int) (int, error) {
	k, _ := s.setIovecs(bufs, off, n)
	s.setMsg(k)
	for {
		r, _, e := unix.Syscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&s.msg)),
			unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(r), nil
	}
}

// recv receives one datagram into bufs (all of them) and returns its length
// and the msghdr flags (unix.MSG_TRUNC when it did not fit).
func (s *sockIO) recv(fd int, bufs [][]byte, flags int) (n, msgFlags int, err error) {
	k, _ := s.setIovecs(bufs, 0, int(^uint(0)>>1))
	s.setMsg(k)
	for {
		r, _, e := unix.Syscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&s.msg)),
			uintptr(flags|unix.MSG_DONTWAIT))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, 0, e
		}
		return int(r), int(s.msg.Flags), nil
	}
}

// pendingDatagram returns the size of the next queued datagram (FIONREAD).
func pendingDatagram(fd int) (int, error) {
	return unix.IoctlGetInt(fd, unix.SIOCINQ)
}

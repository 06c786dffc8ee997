package hostsock

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// MaxBatch bounds the datagrams of one recvmmsg or sendmmsg call.
const MaxBatch = 32

// Batch is a list of datagrams for one recvmmsg or sendmmsg on one socket:
// the system call costs per wakeup what one recvmsg or sendmsg cost per
// datagram. It holds the message headers and iovecs the calls take, so
// none is allocated per call; one Batch belongs to one goroutine.
type Batch struct {
	msgs [MaxBatch]unix.Mmsghdr
	// iov holds every message's buffers; a message takes at most
	// MaxIovecs of them, and Room keeps that much free.
	iov     [2 * MaxIovecs]unix.Iovec
	n, niov int
	calls   uint64
}

// Reset empties the batch.
func (b *Batch) Reset() { b.n, b.niov = 0, 0 }

// Len is the number of datagrams added since Reset.
func (b *Batch) Len() int { return b.n }

// Room reports whether another datagram of up to MaxIovecs buffers fits.
func (b *Batch) Room() bool { return b.n < MaxBatch && len(b.iov)-b.niov >= MaxIovecs }

// Add appends a datagram made of bytes [off, off+n) of the concatenated
// bufs followed by extra (nil: nothing); for a receive, the buffers it is
// received into. It returns how many bytes of bufs the datagram covers:
// fewer than n only when the buffers are more than a message takes
// (MaxIovecs, one of them kept for extra). The caller checks Room first.
func (b *Batch) Add(bufs [][]byte, off, n int, extra []byte) (covered int) {
	if b.n == MaxBatch {
		return 0
	}
	iov := b.iov[b.niov:]
	room := min(len(iov), MaxIovecs)
	if len(extra) > 0 {
		room--
	}
	k := fillIovecs(iov[:room], bufs, off, n)
	for _, v := range iov[:k] {
		covered += int(v.Len)
	}
	if len(extra) > 0 {
		iov[k].Base = &extra[0]
		iov[k].SetLen(len(extra))
		k++
	}
	m := &b.msgs[b.n]
	m.Hdr = unix.Msghdr{}
	m.Len = 0
	if k > 0 {
		m.Hdr.Iov = &iov[0]
		m.Hdr.SetIovlen(k)
	}
	b.niov += k
	b.n++
	return covered
}

// Received is the length and msghdr flags (unix.MSG_TRUNC: it did not
// fit) of datagram j of the last Recv.
func (b *Batch) Received(j int) (n, msgFlags int) {
	return int(b.msgs[j].Len), int(b.msgs[j].Hdr.Flags)
}

// Recv receives up to Len datagrams from fd into the batch's buffers with
// one recvmmsg, without blocking, and returns how many it received (an
// error only when it received none).
func (b *Batch) Recv(fd int) (int, error) {
	if b.n == 0 {
		return 0, nil
	}
	return b.call(unix.SYS_RECVMMSG, fd, 0, unix.MSG_DONTWAIT)
}

// Send sends datagrams [from, Len) of the batch on the connected socket
// fd with one sendmmsg, in order, without blocking and without SIGPIPE,
// and returns how many the kernel took (an error only when it took none:
// the error is datagram from's).
func (b *Batch) Send(fd, from int) (int, error) {
	if from >= b.n {
		return 0, nil
	}
	if faultsEnabled {
		if err := injectedFault(faultSend); err != nil {
			return 0, err
		}
	}
	return b.call(unix.SYS_SENDMMSG, fd, from, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
}

// Calls is how many recvmmsg and sendmmsg calls the batch has made (tests
// count the system calls per datagram with it).
func (b *Batch) Calls() uint64 { return b.calls }

// call runs recvmmsg or sendmmsg on msgs[from:n], again after EINTR.
func (b *Batch) call(trap uintptr, fd, from, flags int) (int, error) {
	for {
		b.calls++
		r, _, e := unix.Syscall6(trap, uintptr(fd), uintptr(unsafe.Pointer(&b.msgs[from])), uintptr(b.n-from), uintptr(flags), 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(r), nil
	}
}

package hostsock

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// MaxBatch bounds the datagrams of one recvmmsg or sendmmsg call: 64, so
// that a guest's USO frame (at most 64 datagrams from a Linux guest before
// 6.9) or a TX batch of single datagrams (64 chains) goes out in one.
const MaxBatch = 64

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
	// out are the messages of SendRuns; ctrl their UDP_SEGMENT control
	// messages, or a Recv's (UDP_GRO).
	out     [MaxBatch]unix.Mmsghdr
	ctrl    [MaxBatch][4]uint64
	segSent uint64
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

// Segment is the UDP_GRO segment size of datagram j of the last Recv: with
// UDP_GRO on the socket (EnableGRO), the kernel may hand over several
// datagrams of one peer of that size (the last maybe shorter) as one,
// coalesced; 0 when j is a single datagram.
func (b *Batch) Segment(j int) int {
	m := &b.msgs[j].Hdr
	if m.Controllen < uint64(unix.CmsgLen(4)) {
		return 0
	}
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b.ctrl[j][0]))
	if h.Level != unix.SOL_UDP || h.Type != unix.UDP_GRO || h.Len < uint64(unix.CmsgLen(4)) {
		return 0
	}
	return int(*(*int32)(unsafe.Add(unsafe.Pointer(&b.ctrl[j][0]), unix.CmsgLen(0))))
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
	for j := range b.msgs[:b.n] {
		m := &b.msgs[j].Hdr
		m.Control = (*byte)(unsafe.Pointer(&b.ctrl[j][0]))
		m.SetControllen(len(b.ctrl[j]) * 8)
	}
	return b.call(unix.SYS_RECVMMSG, fd, 0, b.n, unix.MSG_DONTWAIT)
}

// Send sends datagrams [from, to) of the batch on the connected socket fd
// with one sendmmsg, in order, without blocking and without SIGPIPE, and
// returns how many the kernel took (an error only when it took none: the
// error is datagram from's).
func (b *Batch) Send(fd, from, to int) (int, error) {
	to = min(to, b.n)
	if from >= to {
		return 0, nil
	}
	if faultsEnabled {
		if err := injectedFault(faultSend); err != nil {
			return 0, err
		}
	}
	return b.call(unix.SYS_SENDMMSG, fd, from, to, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
}

// Run is a span of a batch's datagrams, [From, To), that goes to the
// kernel as one message: with Seg > 0 a UDP_SEGMENT message of datagrams
// of Seg bytes (the last at most Seg), which the kernel builds as one
// buffer and cuts into the datagrams as late as it can (UDP GSO), for far
// less per datagram than a message each; else one datagram (To == From+1).
type Run struct{ From, To, Seg int }

// SendRuns sends runs, each one message, on the connected UDP socket fd
// with one sendmmsg, in order, without blocking and without SIGPIPE, and
// returns how many messages the kernel took (an error only when it took
// none: the error is runs[0]'s). A run's datagrams go all or none. The
// kernel refuses a run of more than 64 datagrams or 64 KiB, or whose
// datagrams do not fit the route's MTU (EINVAL), or over a device without
// checksum offload (EIO).
func (b *Batch) SendRuns(fd int, runs []Run) (int, error) {
	runs = runs[:min(len(runs), MaxBatch)]
	if len(runs) == 0 {
		return 0, nil
	}
	if faultsEnabled {
		if err := injectedFault(faultSend); err != nil {
			return 0, err
		}
	}
	for o, r := range runs {
		m := &b.out[o]
		m.Hdr = b.msgs[r.From].Hdr
		m.Len = 0
		if r.Seg <= 0 {
			continue
		}
		k := 0
		for j := r.From; j < r.To; j++ {
			k += int(b.msgs[j].Hdr.Iovlen) // their buffers follow each other
		}
		m.Hdr.SetIovlen(k)
		c := &b.ctrl[o]
		h := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
		h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		h.SetLen(unix.CmsgLen(2))
		*(*uint16)(unsafe.Add(unsafe.Pointer(&c[0]), unix.CmsgLen(0))) = uint16(r.Seg)
		m.Hdr.Control = (*byte)(unsafe.Pointer(&c[0]))
		m.Hdr.SetControllen(unix.CmsgSpace(2))
	}
	for {
		b.calls++
		n, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.out[0])), uintptr(len(runs)),
			unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		for _, r := range runs[:n] {
			if r.Seg > 0 {
				b.segSent++
			}
		}
		return int(n), nil
	}
}

// SegmentedSends is how many UDP_SEGMENT messages SendRuns sent.
func (b *Batch) SegmentedSends() uint64 { return b.segSent }

// Calls is how many system calls the batch has made: recvmmsg, sendmmsg,
// (tests count the calls per datagram with it).
func (b *Batch) Calls() uint64 { return b.calls }

// call runs recvmmsg or sendmmsg on msgs[from:to], again after EINTR.
func (b *Batch) call(trap uintptr, fd, from, to, flags int) (int, error) {
	for {
		b.calls++
		r, _, e := unix.RawSyscall6(trap, uintptr(fd), uintptr(unsafe.Pointer(&b.msgs[from])), uintptr(to-from), uintptr(flags), 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(r), nil
	}
}

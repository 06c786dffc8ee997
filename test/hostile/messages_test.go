package hostile

import (
	"encoding/binary"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	fe "vunet/test/frontend"
)

// session says what state the hostile message meets.
type session int

const (
	fresh      session = iota // connected, one GET_FEATURES, nothing negotiated
	negotiated                // full QEMU start-up, REPLY_ACK on, pair 0 running
)

// msgCase is one malformed or invalid vhost-user message (or short sequence).
type msgCase struct {
	name string
	at   session
	opts fe.Options // for negotiated sessions
	// send delivers the hostile input and reports the server's reaction.
	send func(t *testing.T, f *fe.Frontend) outcome
	// allow lists acceptable outcomes; nil means closed or nack (DESIGN:
	// a bad message gets a failure reply when REPLY_ACK was asked,
	// otherwise the connection is closed).
	allow []outcome
	// noCount skips the error-counter check (inputs that end the session
	// before a message is complete count under io, or not at all).
	noCount bool
	// mustCount requires an error counted even when the message was
	// accepted (ignored unsupported requests).
	mustCount bool
}

// try sends req with NEED_REPLY (REPLY_ACK is negotiated in negotiated
// sessions) and reads the outcome.
func try(t *testing.T, f *fe.Frontend, req fe.Request, payload []byte, fds []int) outcome {
	t.Helper()
	if err := f.Conn.Send(req, fe.FlagNeedReply, payload, fds); err != nil {
		if isClosed(err) {
			return outClosed
		}
		t.Fatalf("send: %v", err)
	}
	return observe(t, f, req, true)
}

// tryNoAck sends req without NEED_REPLY and probes the connection.
func tryNoAck(t *testing.T, f *fe.Frontend, req fe.Request, payload []byte, fds []int) outcome {
	t.Helper()
	if err := f.Conn.Send(req, 0, payload, fds); err != nil {
		if isClosed(err) {
			return outClosed
		}
		t.Fatalf("send: %v", err)
	}
	return observe(t, f, req, false)
}

// raw sends hdr+payload and probes the connection.
func raw(t *testing.T, f *fe.Frontend, hdr, payload []byte, fds []int) outcome {
	t.Helper()
	if err := f.SendRaw(hdr, payload, fds); err != nil {
		if isClosed(err) {
			return outClosed
		}
		t.Fatalf("send raw: %v", err)
	}
	return observe(t, f, fe.ReqGetFeatures, false)
}

// steps runs several requests with NEED_REPLY and returns the first
// outcome that is not acceptance.
func steps(t *testing.T, f *fe.Frontend, reqs ...func() outcome) outcome {
	for _, r := range reqs {
		if o := r(); o != outAccepted {
			return o
		}
	}
	return outAccepted
}

// caseFDs are descriptors a case opened for sending; the runner closes them
// right after the case so the leak check sees only the server's.
var caseFDs []int

func closeCaseFDs() {
	for _, fd := range caseFDs {
		unix.Close(fd)
	}
	caseFDs = nil
}

func eventfd(t *testing.T) int {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	caseFDs = append(caseFDs, fd)
	return fd
}

func eventfds(t *testing.T, n int) []int {
	var out []int
	for i := 0; i < n; i++ {
		out = append(out, eventfd(t))
	}
	return out
}

func u64(v uint64) []byte                   { return fe.PayloadU64(v) }
func state(idx, num uint32) []byte          { return fe.PayloadVringState(idx, num) }
func hdr(r fe.Request, fl, n uint32) []byte { return fe.EncodeHeader(r, fl, n) }

// memfd returns a fresh memfd of size bytes.
func memfd(t *testing.T, size int64) int {
	fd, err := unix.MemfdCreate("hostile", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	caseFDs = append(caseFDs, fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	return fd
}

// pipe returns a blocking pipe; full fills it first.
func pipe(t *testing.T, full bool) (r, w int) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	caseFDs = append(caseFDs, p[0], p[1])
	if full {
		chunk := make([]byte, 4096)
		for {
			if _, err := unix.Write(p[1], chunk); err != nil {
				break
			}
		}
	}
	// O_NONBLOCK belongs to the open file, which the server shares.
	for _, fd := range p {
		if err := unix.SetNonblock(fd, false); err != nil {
			t.Fatal(err)
		}
	}
	return p[0], p[1]
}

// swapRingFD replaces ring idx's kick or call descriptor with fd on a
// running pair, then makes traffic flow through both rings.
func swapRingFD(t *testing.T, f *fe.Frontend, req fe.Request, idx uint32, fd int) outcome {
	t.Helper()
	if o := try(t, f, req, u64(uint64(idx)), []int{fd}); o != outAccepted {
		return o
	}
	p := f.Pair0()
	p.PostRX(8, 2048)
	for i := 0; i < 4; i++ {
		p.SubmitTX(arpRequest())
		p.TX.Kick()
		p.RX.Kick()
		time.Sleep(5 * time.Millisecond)
	}
	return observe(t, f, fe.ReqGetFeatures, false)
}

// region0 is the first region of f's memory.
func region0(f *fe.Frontend) fe.Region { return f.Mem.Regions()[0] }

// idleRing is a ring index the server offers but the default negotiation
// does not start (pair 1 RX).
const idleRing = 2

// startIdleRing starts pair 1: ring 2 with the given (hostile) size and
// addresses, ring 3 with good ones, so the pair really runs and the server
// builds its queues (a pair with one ring started is never touched). Every
// message carries NEED_REPLY.
func startIdleRing(t *testing.T, f *fe.Frontend, num uint32, a fe.VringAddr) outcome {
	a.Index = idleRing
	good := goodAddr(t, f, 256)
	good.Index = idleRing + 1
	return steps(t, f,
		func() outcome { return startRing(t, f, good, 256) },
		func() outcome { return startRing(t, f, a, num) },
	)
}

func startRing(t *testing.T, f *fe.Frontend, a fe.VringAddr, num uint32) outcome {
	i := a.Index
	return steps(t, f,
		func() outcome { return try(t, f, fe.ReqSetVringNum, state(i, num), nil) },
		func() outcome { return try(t, f, fe.ReqSetVringBase, state(i, 0), nil) },
		func() outcome { return try(t, f, fe.ReqSetVringAddr, a.Encode(), nil) },
		func() outcome { return try(t, f, fe.ReqSetVringCall, u64(uint64(i)), []int{eventfd(t)}) },
		func() outcome { return try(t, f, fe.ReqSetVringKick, u64(uint64(i)), []int{eventfd(t)}) },
		func() outcome { return try(t, f, fe.ReqSetVringEnable, state(i, 1), nil) },
	)
}

// goodAddr returns valid ring addresses for an n-entry ring in fresh guest
// memory of f.
func goodAddr(t *testing.T, f *fe.Frontend, n uint16) fe.VringAddr {
	ds, as, us := fe.RingAreaSizes(n)
	var a fe.VringAddr
	for i, sz := range []uint64{ds, as, us} {
		gpa, err := f.Mem.Alloc(sz+4, 16)
		if err != nil {
			t.Fatal(err)
		}
		ua, _ := f.Mem.UserAddr(gpa)
		switch i {
		case 0:
			a.Desc = ua
		case 1:
			a.Avail = ua
		case 2:
			a.Used = ua
		}
	}
	return a
}

// anyOutcome is for inputs that are legal or whose handling the design
// leaves open (unsupported requests are ignored and counted): only crashes,
// hangs and leaks fail them.
var anyOutcome = []outcome{outClosed, outNack, outAccepted}

var messageCases = []msgCase{
	// Framing.
	{name: "truncated header", at: fresh, noCount: true, send: func(t *testing.T, f *fe.Frontend) outcome {
		f.SendRaw(hdr(fe.ReqGetFeatures, 1, 0)[:6], nil, nil)
		f.Conn.Close()
		return outClosed
	}},
	{name: "truncated payload", at: negotiated, noCount: true, send: func(t *testing.T, f *fe.Frontend) outcome {
		f.SendRaw(hdr(fe.ReqSetVringAddr, 1, 40), make([]byte, 8), nil)
		f.Conn.Close()
		return outClosed
	}},
	{name: "size 1 MiB announced, nothing sent", at: fresh, send: func(t *testing.T, f *fe.Frontend) outcome {
		return raw(t, f, hdr(fe.ReqSetFeatures, 1, 1<<20), nil, nil)
	}},
	{name: "size 0xffffffff", at: fresh, send: func(t *testing.T, f *fe.Frontend) outcome {
		return raw(t, f, hdr(fe.ReqSetMemTable, 1, 0xffffffff), nil, nil)
	}},
	{name: "oversized payload sent", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return raw(t, f, hdr(fe.ReqSetFeatures, 1, 8192), make([]byte, 8192), nil)
	}},
	{name: "size lies short for vring addr", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringAddr, make([]byte, 8), nil)
	}},
	{name: "size lies long for u64", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetFeatures, make([]byte, 16), nil)
	}},
	{name: "size zero for u64", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetFeatures, nil, nil)
	}},
	{name: "size lies short for vring state", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringNum, make([]byte, 4), nil)
	}},
	{name: "mem table count above payload", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		p := make([]byte, 8+32)
		binary.LittleEndian.PutUint32(p, 1000)
		return try(t, f, fe.ReqSetMemTable, p, []int{f.Mem.FD()})
	}},
	{name: "version 0 header", at: fresh, send: func(t *testing.T, f *fe.Frontend) outcome {
		return raw(t, f, hdr(fe.ReqGetFeatures, 0, 0), nil, nil)
	}},
	{name: "version 3 header", at: fresh, send: func(t *testing.T, f *fe.Frontend) outcome {
		return raw(t, f, hdr(fe.ReqGetFeatures, 3, 0), nil, nil)
	}, allow: []outcome{outClosed, outNack, outAccepted}},
	{name: "random bytes", at: fresh, noCount: true, send: func(t *testing.T, f *fe.Frontend) outcome {
		b := make([]byte, 200)
		for i := range b {
			b[i] = byte(i*131 + 7)
		}
		return raw(t, f, b, nil, nil)
	}, allow: []outcome{outClosed, outNack}},

	// Unknown requests.
	{name: "unknown request 9999", at: fresh, mustCount: true, allow: anyOutcome, send: func(t *testing.T, f *fe.Frontend) outcome {
		return tryNoAck(t, f, 9999, nil, nil)
	}},
	{name: "request 0", at: fresh, mustCount: true, allow: anyOutcome, send: func(t *testing.T, f *fe.Frontend) outcome {
		return tryNoAck(t, f, 0, nil, nil)
	}},
	{name: "unknown request with need reply", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, 41, u64(0), nil)
	}},
	{name: "IOTLB without IOMMU", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqIOTLBMsg, make([]byte, 40), nil)
	}},

	// Queue indices.
	{name: "vring num index 200", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringNum, state(200, 256), nil)
	}},
	{name: "vring num index 255", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringNum, state(255, 256), nil)
	}},
	{name: "vring num index 2*queues", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringNum, state(2*queuePairs, 256), nil)
	}},
	{name: "vring num index 0xffffffff", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringNum, state(0xffffffff, 256), nil)
	}},
	{name: "vring base index 255", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringBase, state(255, 0), nil)
	}},
	{name: "vring addr index 200", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		a := goodAddr(t, f, 256)
		a.Index = 200
		return try(t, f, fe.ReqSetVringAddr, a.Encode(), nil)
	}},
	{name: "vring kick index 200", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringKick, u64(200), []int{eventfd(t)})
	}},
	{name: "vring call index 255", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringCall, u64(255), []int{eventfd(t)})
	}},
	{name: "vring err index 2*queues", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringErr, u64(2*queuePairs), []int{eventfd(t)})
	}},
	{name: "vring enable index 200", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringEnable, state(200, 1), nil)
	}},
	{name: "vring enable value 7", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringEnable, state(0, 7), nil)
	}, allow: []outcome{outClosed, outNack, outAccepted}},
	{name: "get vring base index 255", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return tryNoAck(t, f, fe.ReqGetVringBase, state(255, 0), nil)
	}},

	// Ring sizes.
	{name: "ring size 0", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringNum, state(idleRing, 0), nil)
	}},
	{name: "ring size 3", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringNum, state(idleRing, 3), nil)
	}},
	{name: "ring size 65536", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringNum, state(idleRing, 65536), nil)
	}},
	{name: "ring size 32769", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringNum, state(idleRing, 32769), nil)
	}},
	{name: "ring size 3 on a running ring", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringNum, state(1, 3), nil)
	}},
	{name: "ring size larger than its area", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		// Addresses sized for 16 entries at the very end of memory, then
		// 32768 entries: the used ring would run past the region.
		regs := f.Mem.Regions()
		last := regs[len(regs)-1]
		end := last.UserAddr + last.Size
		a := fe.VringAddr{Desc: end - 4096, Avail: end - 2048, Used: end - 1024}
		return startIdleRing(t, f, 32768, a)
	}},

	// File descriptor counts.
	{name: "fds attached to get features", at: fresh, send: func(t *testing.T, f *fe.Frontend) outcome {
		if err := f.Conn.Send(fe.ReqGetFeatures, 0, nil, eventfds(t, 3)); err != nil {
			return outClosed
		}
		m, err := f.Conn.Recv()
		if err != nil {
			if isClosed(err) {
				return outClosed
			}
			t.Fatal(err)
		}
		if m.Request == fe.ReqGetFeatures {
			return outAccepted
		}
		return outNack
	}},
	{name: "fd attached to set owner", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetOwner, nil, []int{eventfd(t)})
	}},
	{name: "kick without fd and without no-fd flag", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringKick, u64(0), nil)
	}},
	{name: "call with two fds", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringCall, u64(0), eventfds(t, 2))
	}},
	{name: "kick with no-fd flag and an fd", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringKick, u64(0|fe.VringNoFD), []int{eventfd(t)})
	}},
	{name: "mem table 2 regions 1 fd", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := region0(f)
		r2 := fe.Region{GuestAddr: 1 << 32, Size: 4096, UserAddr: r.UserAddr + r.Size + (1 << 30), MmapOffset: 0}
		return try(t, f, fe.ReqSetMemTable, fe.PayloadMemTable([]fe.Region{r, r2}), []int{f.Mem.FD()})
	}},
	{name: "mem table 1 region 9 fds", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		fds := append([]int{f.Mem.FD()}, eventfds(t, 8)...)
		return try(t, f, fe.ReqSetMemTable, fe.PayloadMemTable([]fe.Region{region0(f)}), fds)
	}},
	{name: "mem table 9 regions", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		fd := memfd(t, 9*4096)
		var regs []fe.Region
		var fds []int
		for i := 0; i < 9; i++ {
			regs = append(regs, fe.Region{GuestAddr: uint64(i) << 32, Size: 4096, UserAddr: 0x7000_0000_0000 + uint64(i)<<32, MmapOffset: uint64(i) * 4096})
			fds = append(fds, fd)
		}
		return try(t, f, fe.ReqSetMemTable, fe.PayloadMemTable(regs), fds)
	}},
	{name: "add mem reg without fd", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := fe.Region{GuestAddr: 1 << 40, Size: 4096, UserAddr: 1 << 45}
		return try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), nil)
	}},
	{name: "add mem reg with two fds", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := fe.Region{GuestAddr: 1 << 40, Size: 4096, UserAddr: 1 << 45}
		return try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), []int{memfd(t, 4096), memfd(t, 4096)})
	}},
	{name: "mem fd is an eventfd", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := fe.Region{GuestAddr: 1 << 40, Size: 4096, UserAddr: 1 << 45}
		return try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), []int{eventfd(t)})
	}},
	// Descriptors of the wrong kind on running rings: epoll refuses regular
	// files, a blocking pipe blocks a read or write that an eventfd would
	// not. The data plane must not hang (StopPair must return), or the
	// next front-end is never served.
	{name: "kick fd is a memfd", at: negotiated, allow: anyOutcome, send: func(t *testing.T, f *fe.Frontend) outcome {
		return swapRingFD(t, f, fe.ReqSetVringKick, 1, memfd(t, 4096))
	}},
	{name: "kick fd is an empty blocking pipe", at: negotiated, allow: anyOutcome, send: func(t *testing.T, f *fe.Frontend) outcome {
		r, _ := pipe(t, false)
		return swapRingFD(t, f, fe.ReqSetVringKick, 1, r)
	}},
	{name: "kick fd is a pipe full of odd-sized writes", at: negotiated, allow: anyOutcome, send: func(t *testing.T, f *fe.Frontend) outcome {
		r, w := pipe(t, false)
		unix.Write(w, []byte{1, 2, 3})
		return swapRingFD(t, f, fe.ReqSetVringKick, 1, r)
	}},
	{name: "call fd is a pipe read end", at: negotiated, allow: anyOutcome, send: func(t *testing.T, f *fe.Frontend) outcome {
		r, _ := pipe(t, false)
		return swapRingFD(t, f, fe.ReqSetVringCall, 0, r)
	}},
	{name: "call fd is a full blocking pipe", at: negotiated, allow: anyOutcome, send: func(t *testing.T, f *fe.Frontend) outcome {
		_, w := pipe(t, true)
		return swapRingFD(t, f, fe.ReqSetVringCall, 0, w)
	}},
	{name: "call fd is a memfd", at: negotiated, allow: anyOutcome, send: func(t *testing.T, f *fe.Frontend) outcome {
		return swapRingFD(t, f, fe.ReqSetVringCall, 1, memfd(t, 4096))
	}},

	// Memory regions.
	{name: "overlapping regions in one table", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := region0(f)
		r2 := r
		r2.GuestAddr += 4096
		r2.UserAddr += 1 << 40
		return try(t, f, fe.ReqSetMemTable, fe.PayloadMemTable([]fe.Region{r, r2}), []int{f.Mem.FD(), f.Mem.FD()})
	}},
	{name: "add mem reg overlapping guest range", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := region0(f)
		r.GuestAddr += 8192
		r.UserAddr += 1 << 40
		return try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), []int{f.Mem.FD()})
	}},
	{name: "add mem reg overlapping user range", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := region0(f)
		r.GuestAddr += 1 << 40
		r.UserAddr += 8192
		return try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), []int{f.Mem.FD()})
	}},
	{name: "zero size region", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := fe.Region{GuestAddr: 1 << 40, Size: 0, UserAddr: 1 << 45}
		return try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), []int{memfd(t, 4096)})
	}},
	{name: "region size 2^63", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := fe.Region{GuestAddr: 1 << 40, Size: 1 << 63, UserAddr: 1 << 45}
		return try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), []int{memfd(t, 4096)})
	}},
	{name: "guest address wraps", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := fe.Region{GuestAddr: ^uint64(0) - 4095, Size: 8192, UserAddr: 1 << 45}
		return try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), []int{memfd(t, 8192)})
	}},
	{name: "user address wraps", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := fe.Region{GuestAddr: 1 << 40, Size: 8192, UserAddr: ^uint64(0) - 4095}
		return try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), []int{memfd(t, 8192)})
	}},
	{name: "mmap offset beyond the fd", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := fe.Region{GuestAddr: 1 << 40, Size: 4096, UserAddr: 1 << 45, MmapOffset: 1 << 40}
		return try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), []int{memfd(t, 4096)})
	}},
	{name: "region larger than the fd, ring inside the missing part", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		// A 64 KiB memfd announced as 64 MiB: mmap succeeds, and touching
		// a page past the file's end raises SIGBUS, which kills a Go
		// process. The back-end must check the size against fstat (or
		// never touch such pages).
		const ua = 0x6000_0000_0000
		r := fe.Region{GuestAddr: 1 << 40, Size: 64 << 20, UserAddr: ua}
		if o := try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), []int{memfd(t, 64<<10)}); o != outAccepted {
			return o
		}
		a := fe.VringAddr{Desc: ua + 32<<20, Avail: ua + 33<<20, Used: ua + 34<<20}
		return startIdleRing(t, f, 256, a)
	}},
	{name: "remove a region that is not mapped", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		r := fe.Region{GuestAddr: 1 << 40, Size: 4096, UserAddr: 1 << 45}
		return try(t, f, fe.ReqRemMemReg, fe.PayloadMemReg(r), nil)
	}},
	{name: "remove the region the rings live in, then kick", at: negotiated, allow: []outcome{outClosed, outNack, outAccepted}, send: func(t *testing.T, f *fe.Frontend) outcome {
		// Legal: the back-end must stop using the rings before unmapping.
		o := try(t, f, fe.ReqRemMemReg, fe.PayloadMemReg(region0(f)), nil)
		if o != outAccepted {
			return o
		}
		f.SubmitTX(arpRequest())
		f.Pair0().TX.Kick()
		time.Sleep(20 * time.Millisecond)
		return observe(t, f, fe.ReqGetFeatures, false)
	}},
	{name: "empty mem table while rings run", at: negotiated, allow: []outcome{outClosed, outNack, outAccepted}, send: func(t *testing.T, f *fe.Frontend) outcome {
		o := try(t, f, fe.ReqSetMemTable, fe.PayloadMemTable(nil), nil)
		if o != outAccepted {
			return o
		}
		f.SubmitTX(arpRequest())
		time.Sleep(20 * time.Millisecond)
		return observe(t, f, fe.ReqGetFeatures, false)
	}},

	// Ring addresses.
	{name: "desc table outside memory", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		a := goodAddr(t, f, 256)
		a.Desc = 0xdead_0000_0000
		return startIdleRing(t, f, 256, a)
	}},
	{name: "avail ring at address 0", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		a := goodAddr(t, f, 256)
		a.Avail = 0
		return startIdleRing(t, f, 256, a)
	}},
	{name: "used ring crossing the region end", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		a := goodAddr(t, f, 256)
		regs := f.Mem.Regions()
		last := regs[len(regs)-1]
		a.Used = last.UserAddr + last.Size - 64
		return startIdleRing(t, f, 256, a)
	}},
	{name: "misaligned desc table", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		a := goodAddr(t, f, 256)
		a.Desc++
		return startIdleRing(t, f, 256, a)
	}},
	{name: "ring in the pc hole", at: negotiated, opts: fe.Options{Layout: fe.LayoutPCHole}, send: func(t *testing.T, f *fe.Frontend) outcome {
		// Mapped in this process but in no region: the back-end must not
		// translate it (the user address range between the regions).
		a := goodAddr(t, f, 256)
		a.Desc = region0(f).UserAddr + 0xa0000 + 0x1000
		return startIdleRing(t, f, 256, a)
	}},
	{name: "ring addresses wrap", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		a := goodAddr(t, f, 256)
		a.Used = ^uint64(0) - 16
		return startIdleRing(t, f, 256, a)
	}},

	// Features and values.
	{name: "set features not offered", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetFeatures, u64(f.Offered|1<<63|1<<55), nil)
	}},
	{name: "set protocol features not offered", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetProtocolFeatures, u64(^uint64(0)), nil)
	}},
	{name: "status above 0xff", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetStatus, u64(0x1_0000_000f), nil)
	}},
	{name: "mtu 0", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqNetSetMTU, u64(0), nil)
	}},
	{name: "mtu 2^32", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqNetSetMTU, u64(1<<32), nil)
	}},
	{name: "rarp payload short", at: negotiated, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSendRARP, []byte{1, 2}, nil)
	}},
	{name: "vring base while ring runs", at: negotiated, allow: []outcome{outClosed, outNack, outAccepted}, send: func(t *testing.T, f *fe.Frontend) outcome {
		return try(t, f, fe.ReqSetVringBase, state(1, 40000), nil)
	}},
	{name: "reset owner then traffic", at: negotiated, allow: []outcome{outClosed, outNack, outAccepted}, send: func(t *testing.T, f *fe.Frontend) outcome {
		o := try(t, f, fe.ReqResetOwner, nil, nil)
		f.SubmitTX(arpRequest())
		if o != outAccepted {
			return o
		}
		return observe(t, f, fe.ReqGetFeatures, false)
	}},
	{name: "stop every ring twice", at: negotiated, allow: []outcome{outClosed, outNack, outAccepted}, send: func(t *testing.T, f *fe.Frontend) outcome {
		for i := 0; i < 2; i++ {
			if _, err := f.Stop(); err != nil {
				if isClosed(err) {
					return outClosed
				}
				t.Fatal(err)
			}
		}
		return observe(t, f, fe.ReqGetFeatures, false)
	}},
}

// fdCount is the number of open descriptors in this process (server and
// front-end share it: each case runs in its own child process).
func fdCount(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// waitFDs waits for the descriptor count to come back to at most base.
func waitFDs(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for fdCount(t) > base {
		if time.Now().After(deadline) {
			ents, _ := os.ReadDir("/proc/self/fd")
			var links []string
			for _, e := range ents {
				l, _ := os.Readlink("/proc/self/fd/" + e.Name())
				links = append(links, e.Name()+"→"+l)
			}
			t.Fatalf("descriptor leak: %d open, %d before: %v", fdCount(t), base, links)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func contains(list []outcome, o outcome) bool {
	for _, x := range list {
		if x == o {
			return true
		}
	}
	return false
}

func TestHostileMessages(t *testing.T) {
	for _, pl := range framePlanes {
		for _, c := range messageCases {
			name := c.name
			if pl.name != "arp" {
				name = pl.name + "/" + name
			}
			t.Run(name, func(t *testing.T) {
				isolate(t, func(t *testing.T) { runMessageCase(t, pl, c) })
			})
		}
	}
}

func runMessageCase(t *testing.T, pl namedPlane, c msgCase) {
	s := startServerWith(t, pl.make(t))
	// Warm up once so lazily created runtime descriptors (epoll, timers)
	// are not counted as leaks.
	s.healthy(t)
	baseFDs := fdCount(t)
	var f *fe.Frontend
	if c.at == fresh {
		f = s.dial(t)
	} else {
		f = s.connect(t, c.opts)
	}
	errsBefore := s.errorCount()
	o := c.send(t, f)
	allow := c.allow
	if allow == nil {
		allow = []outcome{outClosed, outNack}
	}
	if !contains(allow, o) {
		t.Errorf("server answered %v, want one of %v", o, allow)
	}
	closeCaseFDs()
	if (o != outAccepted || c.mustCount) && !c.noCount {
		if s.errorCount() == errsBefore {
			t.Errorf("outcome %v but no control-plane error counted", o)
		}
	}
	f.Close()
	s.healthy(t)
	waitFDs(t, baseFDs)
}

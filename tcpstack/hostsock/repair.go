package hostsock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TCP repair: a connected TCP socket's whole state read out and a new
// socket made into the same connection, in another process or on another
// host, without the peer seeing a thing (Linux's TCP_REPAIR, which CRIU
// and passt use for migration). Repair mode needs CAP_NET_ADMIN, which the
// daemon never holds: a separate helper sets and clears it on the sockets
// the daemon passes it (RepairHelper, cmd/vunet-repair). DumpTCP and
// RestoreTCP do the rest, on sockets the helper put in repair mode.

// Repair queue selectors (linux/tcp.h).
const (
	tcpNoQueue   = 0
	tcpRecvQueue = 1
	tcpSendQueue = 2
)

// Option bits of tcp_info.tcpi_options.
const (
	tcpiOptTimestamps = 1
	tcpiOptSACK       = 2
	tcpiOptWscale     = 4
)

// tcpRepairWindowSize is sizeof(struct tcp_repair_window): snd_wl1,
// snd_wnd, max_window, rcv_wnd, rcv_wup.
const tcpRepairWindowSize = 20

// MaxRepairQueue bounds a queue RestoreTCP takes (a socket's buffers are
// at most a few MiB; the state may come from another process).
const MaxRepairQueue = 16 << 20

// TCPRepairState is a TCP connection as DumpTCP reads it out of a socket in
// repair mode.
type TCPRepairState struct {
	Local, Remote        netip.AddrPort
	SendSeq, RecvSeq     uint32 // sequence of the first byte of each queue
	SendQueue, RecvQueue []byte // unacknowledged and unsent data; received and unread data
	MSS                  uint32
	SndWscale, RcvWscale uint8
	Timestamps, SACK     bool
	Wscale               bool
	TSVal                uint32                    // the socket's TCP timestamp clock
	Window               [tcpRepairWindowSize]byte // struct tcp_repair_window, as the kernel gave it
	PeekOff              int32                     // SO_PEEK_OFF; -1: off
}

// ErrRepair wraps the failures of DumpTCP and RestoreTCP.
var ErrRepair = errors.New("tcp repair")

func repairErr(what string, err error) error { return fmt.Errorf("%w: %s: %w", ErrRepair, what, err) }

// DumpTCP reads the state of fd, a connected TCP socket in repair mode.
// The socket's peek offset is reset on the way (peeking the receive queue
// must start at its head); it is reported in PeekOff.
func DumpTCP(fd int) (*TCPRepairState, error) {
	st := &TCPRepairState{PeekOff: -1}
	la, err := unix.Getsockname(fd)
	if err != nil {
		return nil, repairErr("getsockname", err)
	}
	ra, err := unix.Getpeername(fd)
	if err != nil {
		return nil, repairErr("getpeername", err)
	}
	var ok1, ok2 bool
	st.Local, ok1 = sockAddrPort(la)
	st.Remote, ok2 = sockAddrPort(ra)
	if !ok1 || !ok2 {
		return nil, repairErr("addresses", errors.New("not an IP socket"))
	}
	if off, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF); err == nil && off >= 0 {
		st.PeekOff = int32(off)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, -1); err != nil {
			return nil, repairErr("clear SO_PEEK_OFF", err)
		}
	}
	for _, q := range []struct {
		sel   int
		ioctl uint
		seq   *uint32
		data  *[]byte
	}{{tcpRecvQueue, unix.SIOCINQ, &st.RecvSeq, &st.RecvQueue}, {tcpSendQueue, unix.SIOCOUTQ, &st.SendSeq, &st.SendQueue}} {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, q.sel); err != nil {
			return nil, repairErr("TCP_REPAIR_QUEUE", err)
		}
		seq, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
		if err != nil {
			return nil, repairErr("TCP_QUEUE_SEQ", err)
		}
		*q.seq = uint32(seq)
		n, err := unix.IoctlGetInt(fd, q.ioctl)
		if err != nil {
			return nil, repairErr("queue length", err)
		}
		if n > 0 {
			buf := make([]byte, n)
			got, _, err := unix.Recvfrom(fd, buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
			if err != nil || got != n {
				return nil, repairErr(fmt.Sprintf("read queue %d (%d of %d bytes)", q.sel, got, n), err)
			}
			*q.data = buf
		}
		// TCP_QUEUE_SEQ is where the queue ends (rcv_nxt, write_seq):
		// the state keeps where it starts, which RestoreTCP sets before
		// it refills the queue.
		*q.seq -= uint32(n)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, tcpNoQueue); err != nil {
		return nil, repairErr("TCP_REPAIR_QUEUE", err)
	}
	mss, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_MAXSEG)
	if err != nil {
		return nil, repairErr("TCP_MAXSEG", err)
	}
	st.MSS = uint32(mss)
	var info [8]byte // tcp_info's first bytes: options at 5, the window scales at 6
	if n, err := getsockoptBytes(fd, unix.IPPROTO_TCP, unix.TCP_INFO, info[:]); err != nil || n < len(info) {
		return nil, repairErr("TCP_INFO", err)
	}
	opts := info[5]
	st.Timestamps, st.SACK, st.Wscale = opts&tcpiOptTimestamps != 0, opts&tcpiOptSACK != 0, opts&tcpiOptWscale != 0
	st.SndWscale, st.RcvWscale = info[6]&0xf, info[6]>>4
	if st.Timestamps {
		ts, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_TIMESTAMP)
		if err != nil {
			return nil, repairErr("TCP_TIMESTAMP", err)
		}
		st.TSVal = uint32(ts)
	}
	if n, err := getsockoptBytes(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW, st.Window[:]); err != nil || n != tcpRepairWindowSize {
		return nil, repairErr("TCP_REPAIR_WINDOW", err)
	}
	return st, nil
}

// getsockoptBytes reads a binary option into b and returns its length
// (unix.GetsockoptString stops at the first zero byte).
func getsockoptBytes(fd, level, opt int, b []byte) (int, error) {
	n := uint32(len(b))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// RestoreTCP makes a new socket into the connection st describes. repairOn
// puts a socket in repair mode (through the helper); the socket returned is
// still in it, and the caller takes it out (RepairHelper.Set with
// RepairOff) once it is ready for traffic: the peer then sees the
// connection go on. Nothing is sent before. On error no descriptor is left
// open.
func RestoreTCP(st *TCPRepairState, repairOn func(fd int) error) (fd int, err error) {
	if !st.Local.IsValid() || !st.Remote.IsValid() || st.Local.Addr().Is4() != st.Remote.Addr().Is4() {
		return -1, repairErr("addresses", fmt.Errorf("%v → %v", st.Local, st.Remote))
	}
	if len(st.SendQueue) > MaxRepairQueue || len(st.RecvQueue) > MaxRepairQueue || st.SndWscale > 14 || st.RcvWscale > 14 {
		return -1, repairErr("state", errors.New("queue or window scale out of range"))
	}
	family := unix.AF_INET6
	if st.Local.Addr().Is4() {
		family = unix.AF_INET
	}
	fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, repairErr("socket", err)
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
			fd = -1
		}
	}()
	if err := repairOn(fd); err != nil {
		return fd, repairErr("repair mode on", err)
	}
	set := func(what string, opt, v int) error {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, opt, v); err != nil {
			return repairErr(what, err)
		}
		return nil
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return fd, repairErr("SO_REUSEADDR", err)
	}
	if err := unix.Bind(fd, sockaddrOf(st.Local)); err != nil {
		return fd, repairErr("bind "+st.Local.String(), err)
	}
	for _, q := range []struct {
		sel int
		seq uint32
	}{{tcpRecvQueue, st.RecvSeq}, {tcpSendQueue, st.SendSeq}} {
		if err := set("TCP_REPAIR_QUEUE", unix.TCP_REPAIR_QUEUE, q.sel); err != nil {
			return fd, err
		}
		if err := set("TCP_QUEUE_SEQ", unix.TCP_QUEUE_SEQ, int(int32(q.seq))); err != nil {
			return fd, err
		}
	}
	if err := set("TCP_REPAIR_QUEUE", unix.TCP_REPAIR_QUEUE, tcpNoQueue); err != nil {
		return fd, err
	}
	// In repair mode connect() sends no SYN: the socket is established.
	if err := unix.Connect(fd, sockaddrOf(st.Remote)); err != nil {
		return fd, repairErr("connect "+st.Remote.String(), err)
	}
	opts := []unix.TCPRepairOpt{{Code: unix.TCPOPT_MAXSEG, Val: st.MSS}}
	if st.Wscale {
		opts = append(opts, unix.TCPRepairOpt{Code: unix.TCPOPT_WINDOW, Val: uint32(st.SndWscale) | uint32(st.RcvWscale)<<16})
	}
	if st.SACK {
		opts = append(opts, unix.TCPRepairOpt{Code: unix.TCPOPT_SACK_PERMITTED})
	}
	if st.Timestamps {
		opts = append(opts, unix.TCPRepairOpt{Code: unix.TCPOPT_TIMESTAMP})
	}
	ob := make([]byte, 0, 8*len(opts))
	for _, o := range opts {
		ob = binary.NativeEndian.AppendUint32(ob, o.Code)
		ob = binary.NativeEndian.AppendUint32(ob, o.Val)
	}
	if err := unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_OPTIONS, string(ob)); err != nil {
		return fd, repairErr("TCP_REPAIR_OPTIONS", err)
	}
	if st.Timestamps {
		if err := set("TCP_TIMESTAMP", unix.TCP_TIMESTAMP, int(int32(st.TSVal))); err != nil {
			return fd, err
		}
	}
	for _, q := range []struct {
		sel  int
		buf  int // SO_SNDBUF or SO_RCVBUF
		data []byte
	}{{tcpSendQueue, unix.SO_SNDBUF, st.SendQueue}, {tcpRecvQueue, unix.SO_RCVBUF, st.RecvQueue}} {
		if len(q.data) == 0 {
			continue
		}
		// A queue larger than a new socket's buffer does not fit: the
		// buffer is raised to hold it (which ends its auto-tuning, the
		// price of a large queue; the kernel doubles what it is given).
		if cur, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, q.buf); err == nil && cur < 2*len(q.data) {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, q.buf, len(q.data)+len(q.data)/2); err != nil {
				return fd, repairErr("buffer size", err)
			}
		}
		if err := set("TCP_REPAIR_QUEUE", unix.TCP_REPAIR_QUEUE, q.sel); err != nil {
			return fd, err
		}
		for b := q.data; len(b) > 0; {
			n, err := unix.SendmsgN(fd, b, nil, nil, unix.MSG_DONTWAIT)
			if err != nil {
				return fd, repairErr(fmt.Sprintf("refill queue %d", q.sel), err)
			}
			b = b[n:]
		}
	}
	if err := set("TCP_REPAIR_QUEUE", unix.TCP_REPAIR_QUEUE, tcpNoQueue); err != nil {
		return fd, err
	}
	if err := unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW, string(st.Window[:])); err != nil {
		return fd, repairErr("TCP_REPAIR_WINDOW", err)
	}
	if st.PeekOff >= 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, int(st.PeekOff)); err != nil {
			return fd, repairErr("SO_PEEK_OFF", err)
		}
	}
	return fd, nil
}

// sockAddrPort converts a socket address keeping its family (an
// IPv4-mapped address stays IPv6: the new socket must be of the same kind).
func sockAddrPort(sa unix.Sockaddr) (netip.AddrPort, bool) {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), true
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)), true
	}
	return netip.AddrPort{}, false
}

func sockaddrOf(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}

package frontend

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// Frontend is one vhost-user front-end: a connection, guest memory and the
// driver side of its queue pairs. Not safe for concurrent use, except that
// different pairs' data methods may run in different goroutines once
// Negotiate has returned.
type Frontend struct {
	Conn *Conn
	Mem  *Memory

	// Filled by Negotiate.
	Offered, Features         uint64 // virtio features offered / acked
	ProtocolOffered, Protocol uint64 // protocol features offered / acked
	QueueNum, MaxMemSlots     uint64
	Pairs                     []*Pair

	opts   Options
	ownMem bool
	errFDs []int
}

// Dial connects to a back-end listening on path.
func Dial(path string) (*Frontend, error) {
	c, err := DialConn(path)
	if err != nil {
		return nil, err
	}
	return &Frontend{Conn: c}, nil
}

// New wraps an already-connected socket (for example one end of a socketpair
// handed to vhostuser.ServeConn).
func New(conn *net.UnixConn) *Frontend { return &Frontend{Conn: NewConn(conn)} }

// Close closes the connection, the eventfds and guest memory the front-end
// created. Memory passed in Options.Memory is left open.
func (f *Frontend) Close() error {
	var err error
	if f.Conn != nil {
		err = f.Conn.Close()
	}
	for _, p := range f.Pairs {
		p.RX.closeFDs()
		p.TX.closeFDs()
	}
	for _, fd := range f.errFDs {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	f.errFDs = nil
	if f.ownMem && f.Mem != nil {
		if cerr := f.Mem.Close(); err == nil {
			err = cerr
		}
		f.Mem = nil
	}
	return err
}

// SendRaw writes an arbitrary header and payload with fds (hostile tests).
func (f *Frontend) SendRaw(hdr, payload []byte, fds []int) error {
	return f.Conn.SendRaw(hdr, payload, fds)
}

// Has reports whether virtio feature bit was acked.
func (f *Frontend) Has(bit int) bool { return f.Features&Bit(bit) != 0 }

// HasProtocol reports whether protocol feature bit was acked.
func (f *Frontend) HasProtocol(bit int) bool { return f.Protocol&Bit(bit) != 0 }

// Rings returns every ring in vring-index order.
func (f *Frontend) Rings() []*Ring {
	var out []*Ring
	for _, p := range f.Pairs {
		out = append(out, p.RX, p.TX)
	}
	return out
}

// needReply decides NEED_REPLY like QEMU (ADD_MEM_REG, NET_SET_MTU), or for
// every request without a reply of its own when Options.AckAll is set.
func (f *Frontend) needReply(req Request) bool {
	if !f.HasProtocol(ProtoReplyAck) {
		return false
	}
	return f.opts.AckAll || req == ReqAddMemReg || req == ReqNetSetMTU
}

func (f *Frontend) do(req Request, payload []byte, fds []int) error {
	return f.Conn.Do(req, payload, fds, f.needReply(req))
}

func (f *Frontend) getU64(req Request) (uint64, error) {
	m, err := f.Conn.Call(req, nil, nil)
	if err != nil {
		return 0, err
	}
	return m.U64()
}

// GetFeatures sends GET_FEATURES.
func (f *Frontend) GetFeatures() (uint64, error) { return f.getU64(ReqGetFeatures) }

// SetFeatures sends SET_FEATURES.
func (f *Frontend) SetFeatures(v uint64) error { return f.do(ReqSetFeatures, PayloadU64(v), nil) }

// GetProtocolFeatures sends GET_PROTOCOL_FEATURES.
func (f *Frontend) GetProtocolFeatures() (uint64, error) {
	return f.getU64(ReqGetProtocolFeatures)
}

// SetProtocolFeatures sends SET_PROTOCOL_FEATURES.
func (f *Frontend) SetProtocolFeatures(v uint64) error {
	return f.do(ReqSetProtocolFeatures, PayloadU64(v), nil)
}

// GetQueueNum sends GET_QUEUE_NUM.
func (f *Frontend) GetQueueNum() (uint64, error) { return f.getU64(ReqGetQueueNum) }

// GetMaxMemSlots sends GET_MAX_MEM_SLOTS.
func (f *Frontend) GetMaxMemSlots() (uint64, error) { return f.getU64(ReqGetMaxMemSlots) }

// GetStatus sends GET_STATUS.
func (f *Frontend) GetStatus() (uint64, error) { return f.getU64(ReqGetStatus) }

// SetStatus sends SET_STATUS.
func (f *Frontend) SetStatus(v uint64) error { return f.do(ReqSetStatus, PayloadU64(v), nil) }

// SetOwner sends SET_OWNER.
func (f *Frontend) SetOwner() error { return f.do(ReqSetOwner, nil, nil) }

// NetSetMTU sends NET_SET_MTU.
func (f *Frontend) NetSetMTU(mtu int) error { return f.do(ReqNetSetMTU, PayloadU64(uint64(mtu)), nil) }

// SendRARP sends SEND_RARP with mac in the first 6 bytes of the u64.
func (f *Frontend) SendRARP(mac [6]byte) error {
	b := make([]byte, 8)
	copy(b, mac[:])
	return f.do(ReqSendRARP, b, nil)
}

// SetMemTable sends SET_MEM_TABLE with one fd per region.
func (f *Frontend) SetMemTable(regions []Region, fds []int) error {
	return f.do(ReqSetMemTable, PayloadMemTable(regions), fds)
}

// AddMemReg sends ADD_MEM_REG for one region.
func (f *Frontend) AddMemReg(r Region, fd int) error {
	return f.do(ReqAddMemReg, PayloadMemReg(r), []int{fd})
}

// RemMemReg sends REM_MEM_REG for one region (no fd, as the spec asks).
func (f *Frontend) RemMemReg(r Region) error { return f.do(ReqRemMemReg, PayloadMemReg(r), nil) }

// SetVringNum sends SET_VRING_NUM.
func (f *Frontend) SetVringNum(idx, num uint32) error {
	return f.do(ReqSetVringNum, PayloadVringState(idx, num), nil)
}

// SetVringBase sends SET_VRING_BASE.
func (f *Frontend) SetVringBase(idx, base uint32) error {
	return f.do(ReqSetVringBase, PayloadVringState(idx, base), nil)
}

// SetVringAddr sends SET_VRING_ADDR.
func (f *Frontend) SetVringAddr(a VringAddr) error {
	return f.do(ReqSetVringAddr, a.Encode(), nil)
}

// SetVringEnable sends SET_VRING_ENABLE.
func (f *Frontend) SetVringEnable(idx uint32, on bool) error {
	var v uint32
	if on {
		v = 1
	}
	return f.do(ReqSetVringEnable, PayloadVringState(idx, v), nil)
}

// SetVringFD sends SET_VRING_KICK, _CALL or _ERR; fd < 0 sends the no-fd
// flag instead of an fd.
func (f *Frontend) SetVringFD(req Request, idx uint32, fd int) error {
	v := uint64(idx)
	var fds []int
	if fd < 0 {
		v |= VringNoFD
	} else {
		fds = []int{fd}
	}
	return f.do(req, PayloadU64(v), fds)
}

// GetVringBase sends GET_VRING_BASE, which stops the ring, and returns the
// device's next avail index.
func (f *Frontend) GetVringBase(idx uint32) (uint32, error) {
	m, err := f.Conn.Call(ReqGetVringBase, PayloadVringState(idx, 0), nil)
	if err != nil {
		return 0, err
	}
	if len(m.Payload) < 8 {
		return 0, fmt.Errorf("get vring base %d: reply of %d bytes", idx, len(m.Payload))
	}
	if got := binary.LittleEndian.Uint32(m.Payload); got != idx {
		return 0, fmt.Errorf("get vring base %d: reply for ring %d", idx, got)
	}
	return binary.LittleEndian.Uint32(m.Payload[4:]), nil
}

// Sync is a round trip (GET_FEATURES): when it returns, the back-end has
// handled every earlier message, since it handles them in order.
func (f *Frontend) Sync() error {
	_, err := f.GetFeatures()
	return err
}

// Stop does QEMU's shutdown: SET_STATUS(0) when STATUS was negotiated, then
// GET_VRING_BASE for every ring; it returns the indices in ring order.
func (f *Frontend) Stop() ([]uint32, error) {
	if f.HasProtocol(ProtoStatus) {
		if err := f.SetStatus(0); err != nil {
			return nil, fmt.Errorf("stop: %w", err)
		}
	}
	var out []uint32
	for _, r := range f.Rings() {
		v, err := f.GetVringBase(uint32(r.Index))
		if err != nil {
			return out, fmt.Errorf("stop: %w", err)
		}
		out = append(out, v)
	}
	return out, nil
}

// Pair0 returns queue pair 0.
func (f *Frontend) Pair0() *Pair {
	if len(f.Pairs) == 0 {
		return nil
	}
	return f.Pairs[0]
}

var errNotNegotiated = errors.New("front-end not negotiated")

// PostRX posts n RX buffers of bufSize bytes on pair 0.
func (f *Frontend) PostRX(n, bufSize int) error {
	if f.Pair0() == nil {
		return errNotNegotiated
	}
	return f.Pair0().PostRX(n, bufSize)
}

// SubmitTX sends frames on pair 0.
func (f *Frontend) SubmitTX(frames ...[]byte) error {
	if f.Pair0() == nil {
		return errNotNegotiated
	}
	return f.Pair0().SubmitTX(frames...)
}

// ReceiveRX receives frames on pair 0.
func (f *Frontend) ReceiveRX(timeout time.Duration) ([]Frame, error) {
	if f.Pair0() == nil {
		return nil, errNotNegotiated
	}
	return f.Pair0().ReceiveRX(timeout)
}

// ReclaimTX reclaims used TX chains on pair 0.
func (f *Frontend) ReclaimTX() (int, error) {
	if f.Pair0() == nil {
		return 0, errNotNegotiated
	}
	return f.Pair0().ReclaimTX()
}

package hostsock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// The wire form of a TCPRepairState, for the device-state stream of a
// migration: little-endian, fixed fields, then the two queues.
//
//	u8 version, u8 flags (1 timestamps, 2 SACK, 4 window scaling, 8 IPv4 socket),
//	u8 snd_wscale, u8 rcv_wscale, [16]byte local, u16 port, [16]byte remote, u16 port,
//	u32 send seq, u32 recv seq, u32 mss, u32 tsval, i32 peek offset,
//	[20]byte window, u32 send queue length, u32 recv queue length, queues

const repairStateVersion = 1

const repairStateFixed = 4 + 18 + 18 + 5*4 + tcpRepairWindowSize + 2*4

// ErrRepairState wraps every decoding error of UnmarshalBinary.
var ErrRepairState = errors.New("bad TCP repair state")

// MarshalBinary encodes st.
func (st *TCPRepairState) MarshalBinary() ([]byte, error) {
	if len(st.SendQueue) > MaxRepairQueue || len(st.RecvQueue) > MaxRepairQueue {
		return nil, fmt.Errorf("queues of %d and %d bytes: %w", len(st.SendQueue), len(st.RecvQueue), ErrRepairState)
	}
	var flags byte
	if st.Timestamps {
		flags |= 1
	}
	if st.SACK {
		flags |= 2
	}
	if st.Wscale {
		flags |= 4
	}
	if st.Local.Addr().Is4() {
		flags |= 8
	}
	le := binary.LittleEndian
	b := make([]byte, 0, repairStateFixed+len(st.SendQueue)+len(st.RecvQueue))
	b = append(b, repairStateVersion, flags, st.SndWscale, st.RcvWscale)
	for _, ap := range []netip.AddrPort{st.Local, st.Remote} {
		a := ap.Addr().As16()
		b = append(b, a[:]...)
		b = le.AppendUint16(b, ap.Port())
	}
	for _, v := range []uint32{st.SendSeq, st.RecvSeq, st.MSS, st.TSVal, uint32(st.PeekOff)} {
		b = le.AppendUint32(b, v)
	}
	b = append(b, st.Window[:]...)
	b = le.AppendUint32(b, uint32(len(st.SendQueue)))
	b = le.AppendUint32(b, uint32(len(st.RecvQueue)))
	b = append(b, st.SendQueue...)
	return append(b, st.RecvQueue...), nil
}

// UnmarshalBinary decodes b into st, checking it: the bytes come from the
// migration stream, the front-end's word.
func (st *TCPRepairState) UnmarshalBinary(b []byte) error {
	bad := func(what string) error { return fmt.Errorf("%s: %w", what, ErrRepairState) }
	if len(b) < repairStateFixed {
		return bad(fmt.Sprintf("%d bytes", len(b)))
	}
	if b[0] != repairStateVersion || b[1]&^15 != 0 || b[2] > 14 || b[3] > 14 {
		return bad("version, flags or window scales")
	}
	le := binary.LittleEndian
	*st = TCPRepairState{Timestamps: b[1]&1 != 0, SACK: b[1]&2 != 0, Wscale: b[1]&4 != 0, SndWscale: b[2], RcvWscale: b[3]}
	p := b[4:]
	for _, ap := range []*netip.AddrPort{&st.Local, &st.Remote} {
		a := netip.AddrFrom16([16]byte(p[:16]))
		if b[1]&8 != 0 {
			// An IPv4 socket's address; an IPv6 socket keeps even a
			// mapped one as it is.
			if !a.Is4In6() {
				return bad("IPv4 socket with an IPv6 address")
			}
			a = a.Unmap()
		}
		*ap = netip.AddrPortFrom(a, le.Uint16(p[16:]))
		p = p[18:]
	}
	st.SendSeq, st.RecvSeq, st.MSS, st.TSVal = le.Uint32(p), le.Uint32(p[4:]), le.Uint32(p[8:]), le.Uint32(p[12:])
	st.PeekOff = int32(le.Uint32(p[16:]))
	p = p[20:]
	copy(st.Window[:], p)
	p = p[tcpRepairWindowSize:]
	ns, nr := le.Uint32(p), le.Uint32(p[4:])
	p = p[8:]
	if ns > MaxRepairQueue || nr > MaxRepairQueue || uint64(ns)+uint64(nr) != uint64(len(p)) {
		return bad(fmt.Sprintf("queues of %d and %d bytes in %d", ns, nr, len(p)))
	}
	st.SendQueue = append([]byte(nil), p[:ns]...)
	st.RecvQueue = append([]byte(nil), p[ns:]...)
	switch {
	case st.MSS == 0 || st.MSS > 65535:
		return bad("mss")
	case st.PeekOff < -1:
		return bad("peek offset")
	case !st.Local.IsValid() || !st.Remote.IsValid() || st.Local.Addr().Is4() != st.Remote.Addr().Is4() ||
		st.Local.Port() == 0 || st.Remote.Port() == 0 || st.Remote.Addr().IsUnspecified() || st.Remote.Addr().IsMulticast():
		return bad("addresses")
	}
	return nil
}

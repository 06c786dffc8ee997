package dgram

import (
	"encoding/binary"
	"time"
)

// Flows across queue pairs, as for TCP connections (tcpstack/tcp's
// directory.go): the tables publish their flows in a directory the queue
// pairs share; a guest datagram whose flow this table lacks asks it before
// a new host socket is opened, and when another pair holds the flow the
// caller takes the frame and fetches the flow, which that pair gives away
// with HandOff (the live-migration encoding, handover.go) and this one
// takes with Import. A UDP flow keeps its host port and a ping flow its
// echo identifier across the move; datagrams queued on the socket are read
// by the new owner.

// Directory is what a table tells the other queue pairs' tables about its
// flows, and asks them. One table's calls come from one goroutine at a
// time.
type Directory interface {
	// Sum returns the fingerprint of a flow key's bytes. The key is an
	// array, passed by value: a slice would escape through the interface
	// and cost an allocation per new flow.
	Sum(key [38]byte) uint64
	// Add and Remove say that the table holds (no longer holds) a flow
	// with fingerprint fp.
	Add(fp uint64)
	Remove(fp uint64)
	// Fetch is asked for a guest datagram whose flow the table does not
	// hold. True: another pair holds it, and the caller took the frame
	// (it hands it in again once the flow is here, or drops it).
	Fetch(fp uint64) bool
	// Held reports whether another pair holds a flow with fingerprint fp.
	Held(fp uint64) bool
}

// SetDirectory makes the table publish its flows in d (nil: none) and ask
// it about datagrams it has no flow for.
func (ft *Table) SetDirectory(d Directory) {
	for i := range ft.flows {
		f := &ft.flows[i]
		if !f.inUse {
			continue
		}
		if ft.dir != nil {
			ft.dir.Remove(f.fp)
		}
		f.fp = 0
		if d != nil {
			f.fp = keySum(d, &f.key)
			d.Add(f.fp)
		}
	}
	ft.dir = d
}

// keySum is the fingerprint of k in d.
func keySum(d Directory, k *flowKey) uint64 {
	var b [38]byte // kind, family, addresses, ports
	b[0] = 'D'
	b[1] = byte(k.kind)
	if k.v6 {
		b[1] |= 0x80
	}
	copy(b[2:18], k.guestIP[:])
	copy(b[18:34], k.remoteIP[:])
	binary.BigEndian.PutUint16(b[34:36], k.guestPort)
	binary.BigEndian.PutUint16(b[36:38], k.remotePort)
	return d.Sum(b)
}

// HandOff gives away the flow whose fingerprint is fp, for another table of
// this process to Import: its state encoded, and its socket, which now
// belongs to the caller (it left this table's epoll set and is not
// closed). The state is appended to dst (with StateSize bytes of room
// there, nothing is allocated). ok is false when the table holds no such
// flow.
func (ft *Table) HandOff(now time.Time, fp uint64, dst []byte) (state []byte, fd int, ok bool) {
	if fp == 0 {
		return nil, -1, false
	}
	for i := range ft.flows {
		f := &ft.flows[i]
		if !f.inUse || f.fp != fp {
			continue
		}
		b, err := encodeFlow(now, f, dst)
		if err != nil {
			return nil, -1, false
		}
		fd = f.fd
		if ft.ep != nil {
			_ = ft.ep.Del(fd)
		}
		ft.release(int32(i))
		ft.st.Flows.MovedOut[f.key.kind.proto()].Add(1)
		return b, fd, true
	}
	return nil, -1, false
}

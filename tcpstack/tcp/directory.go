package tcp

import (
	"encoding/binary"
	"time"

	"vunet/tcpstack/stats"
)

// Connections across queue pairs. A guest with several queue pairs may
// send a connection's next segment on another TX queue than the last one
// (Linux re-picks a socket's queue when its thread moves to another vCPU);
// each pair's loop has a table of its own, and the connection must follow
// the guest there instead of being reset. The tables publish their
// connections in a directory shared by the pairs (tcpstack/flowdir behind
// the Directory interface): a segment whose connection this table lacks
// asks the directory before it is answered with RST or opens a connection,
// and when another pair holds it the caller takes the frame and fetches the
// connection (tcpstack's moves.go). The pair that holds it hands it over
// with HandOff, the same encoding the live-migration hand-over uses
// (handover.go), and the fetching table takes it with Import. Nothing of
// this runs for a segment whose connection is in the table.

// Directory is what a table tells the other queue pairs' tables about its
// connections, and asks them. One table's calls come from one goroutine at
// a time.
type Directory interface {
	// Sum returns the fingerprint of a connection key's bytes. The key
	// is an array, passed by value: a slice would escape through the
	// interface and cost an allocation per new connection.
	Sum(key [38]byte) uint64
	// Add and Remove say that the table holds (no longer holds) a
	// connection with fingerprint fp.
	Add(fp uint64)
	Remove(fp uint64)
	// Fetch is asked for a guest segment whose connection the table does
	// not hold. True: another pair holds it, and the caller took the frame
	// (it hands it in again once the connection is here, or drops it);
	// the table does nothing more with it.
	Fetch(fp uint64) bool
}

// SetDirectory makes the table publish its connections in d (nil: none)
// and ask it about segments it has no connection for.
func (t *Table) SetDirectory(d Directory) {
	for _, s := range t.active {
		f := &t.flows[s]
		if t.dir != nil {
			t.dir.Remove(f.fp)
		}
		f.fp = 0
		if d != nil {
			f.fp = keySum(d, &f.key)
			d.Add(f.fp)
		}
	}
	t.dir = d
}

// keySum is the fingerprint of k in d.
func keySum(d Directory, k *connKey) uint64 {
	var b [38]byte // "T", addresses, ports, family
	b[0] = 'T'
	copy(b[1:17], k.guestAddr[:])
	copy(b[17:33], k.remoteAddr[:])
	binary.BigEndian.PutUint16(b[33:35], k.guestPort)
	binary.BigEndian.PutUint16(b[35:37], k.remotePort)
	if k.v6 {
		b[37] = 1
	}
	return d.Sum(b)
}

// fetchElsewhere asks the directory about a segment whose connection the
// table lacks; true: the caller took the frame.
func (t *Table) fetchElsewhere(k *connKey) bool {
	return t.dir != nil && t.dir.Fetch(keySum(t.dir, k))
}

// HandOff gives away the connection whose fingerprint is fp, for another
// table of this process to Import: its state encoded, and its socket,
// which now belongs to the caller (it left this table's epoll set and is
// not closed). ok is false when the table holds no such connection with a
// socket (a connection being reset has none: the other table answers the
// guest with RST itself). Frames the connection already committed to this
// pair's RX ring must be published before the other table sends any.
func (t *Table) HandOff(now time.Time, fp uint64) (state []byte, fd int, ok bool) {
	if fp == 0 {
		return nil, -1, false
	}
	for _, s := range t.active {
		f := &t.flows[s]
		if f.fp != fp || f.fd < 0 || f.state == stats.TCPFree || f.state == stats.TCPResetting {
			continue
		}
		b, err := t.encode(now, f)
		if err != nil {
			t.log.Error("tcp hand-off: encode connection", "err", err)
			return nil, -1, false
		}
		fd = f.fd
		if f.inEpoll && t.poll != nil {
			_ = t.poll.Del(fd)
		}
		f.inEpoll, f.epollEvents, f.fd = false, 0, -1
		t.handedOff(f)
		return b, fd, true
	}
	return nil, -1, false
}

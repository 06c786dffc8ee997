package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// Hand-over of connections to another Table, in another vunet on the same
// host, when QEMU live-migrates the guest (package tcpstack/handover
// carries them): Export encodes every connection's state and names its
// host socket, the other process receives the socket (SCM_RIGHTS: the same
// open socket) and Imports the state, and once it has taken over, this
// table Forgets the connections, closing only its own descriptors — the
// socket, its queues, its sequence numbers and its peek offset live on in
// the kernel, shared, so the host peer sees nothing. Both tables are
// detached (no loop runs) while they export or import, so the state does
// not move under the copy.

// connStateVersion is the version of connWire; Import refuses another.
const connStateVersion = 2

// connWire is a connection's state on the wire, little-endian
// (encoding/binary): the conn fields that mean something in another
// process. Times are ages before the export (ns), or noTime; descriptors,
// slots, generations, output-list links and the ring budget's sender
// period are the receiving table's own.
type connWire struct {
	Version    uint8
	State      uint8
	V6         bool
	WsFrom     uint8
	Events     uint16
	Flags      uint16
	GuestMAC   [6]byte
	GuestPort  uint16
	RemotePort uint16
	GuestAddr  [16]byte
	RemoteAddr [16]byte

	ISS, SeqToGuest, SndMax, SeqAckFromGuest, EOFSeq, WndFromGuest uint32
	MSSToGuest                                                     uint32
	DupAcks, Retrans, WsTo, DupAcksDue                             uint8
	SeqInitFromGuest, AckBase                                      uint32
	SndBuf                                                         int64
	SndRatio                                                       uint16
	DupAckSent, GuestSACK, InEpoll                                 bool
	SeqFromGuest, SeqAckToGuest, AckSent                           uint32
	WndToGuest, WndSent, MaxWndSent, DupAckSeq                     uint32
	EpollEvents                                                    uint32
	Clamp                                                          int64
	Recover                                                        uint32

	Created, LastActivity, LastAckProg, AckDueAt, SndBufAt int64
	AckCheckIvl                                            int64
}

// connWireSize is the encoded size of a connection's state.
var connWireSize = binary.Size(connWire{})

// noTime stands for a zero time.Time.
const noTime = math.MinInt64

// Known bits of conn.events and conn.flags; Import refuses others.
const (
	eventsKnown = evSockFin | evSockShut | evGuestFin | evGuestFinSent | evGuestFinAck | evSockRdHup
	flagsKnown  = flStalled | flSynAckDue | flAckDue | flRstDue | flDirty | flLocal | flWantOut |
		flConnected | flWndStall | flRxBlocked | flSynDue | flOutArmed | flAckCheck | flZeroWnd | flProbeDue
)

// maxAge bounds the ages Import takes: a connection older than this (or a
// garbage age) is taken as this old.
const maxAge = 365 * 24 * time.Hour

// Exported is one connection as Export hands it out.
type Exported struct {
	State []byte // for Import, in the other table
	FD    int    // the connection's host socket, still this table's
	slot  int32
	gen   uint32
}

// Export returns every connection that has a host socket, its state
// encoded for Import. The table keeps them unchanged; Forget drops them
// once another table took them over. A connection whose socket is already
// closed (an RST to the guest pending) is left out: the guest learns from
// the other table's RST to its next segment.
func (t *Table) Export(now time.Time) []Exported {
	out := make([]Exported, 0, len(t.active))
	for _, s := range t.active {
		f := &t.flows[s]
		if f.fd < 0 || f.state == stats.TCPFree {
			continue
		}
		b, err := t.encode(now, f)
		if err != nil {
			t.log.Error("tcp hand-over: encode connection", "err", err)
			continue
		}
		out = append(out, Exported{State: b, FD: f.fd, slot: f.slot, gen: f.gen})
		f.sole = false // the importer and the TCP_REPAIR helper get the socket too
	}
	return out
}

// encode returns f's state for Import.
func (t *Table) encode(now time.Time, f *conn) ([]byte, error) {
	w := connWire{
		Version: connStateVersion, State: uint8(f.state), V6: f.key.v6, WsFrom: f.wsFromGuest,
		Events: f.events, Flags: f.flags &^ flDirty, GuestMAC: f.guestMAC,
		GuestPort: f.guestPort, RemotePort: f.remotePort,
		GuestAddr: f.guestAddr.As16(), RemoteAddr: f.remoteAddr.As16(),
		ISS: f.iss, SeqToGuest: f.seqToGuest, SndMax: f.sndMax, SeqAckFromGuest: f.seqAckFromGuest,
		EOFSeq: f.eofSeq, WndFromGuest: f.wndFromGuest, MSSToGuest: uint32(f.mssToGuest),
		DupAcks: f.dupAcks, Retrans: f.retrans, WsTo: f.wsToGuest, DupAcksDue: f.dupAcksDue,
		SeqInitFromGuest: f.seqInitFromGuest, AckBase: f.ackBase, SndBuf: int64(f.sndBuf),
		SndRatio: f.sndRatio, DupAckSent: f.dupAckSent, GuestSACK: f.guestSACK, InEpoll: f.inEpoll,
		SeqFromGuest: f.seqFromGuest, SeqAckToGuest: f.seqAckToGuest, AckSent: f.ackSent,
		WndToGuest: f.wndToGuest, WndSent: f.wndSent, MaxWndSent: f.maxWndSent, DupAckSeq: f.dupAckSeq,
		EpollEvents: f.epollEvents &^ unix.EPOLLPRI, Clamp: int64(f.clamp), Recover: f.recover,
		Created: age(now, f.created), LastActivity: age(now, f.lastActivity),
		LastAckProg: age(now, f.lastAckProg), AckDueAt: age(now, f.ackDueAt), SndBufAt: age(now, f.sndBufAt),
		AckCheckIvl: int64(f.ackCheckIvl),
	}
	return binary.Append(make([]byte, 0, connWireSize), binary.LittleEndian, &w)
}

// Forget drops connections Export returned that another table took over:
// their descriptors are closed (the socket stays open in the other
// process, so neither the host peer nor the guest hears of it) and their
// slots freed. A slot that was reused since is left alone. It returns how
// many were dropped.
func (t *Table) Forget(ex []Exported) int {
	n := 0
	for _, e := range ex {
		if e.slot < 0 || int(e.slot) >= len(t.flows) {
			continue
		}
		f := &t.flows[e.slot]
		if f.gen != e.gen || f.state == stats.TCPFree || f.fd != e.FD {
			continue
		}
		t.closeSocket(f, false)
		t.handedOff(f)
		n++
	}
	return n
}

// Errors of Import, matched with errors.Is.
var (
	ErrImportState = errors.New("tcp hand-over: bad connection state")
	ErrImportTaken = errors.New("tcp hand-over: connection exists or table full")
)

// Import adds a connection another table exported, with fd, the same host
// socket received from it. The state is another process's word and is
// checked like guest input (sizes, states, windows, addresses, that fd is a
// TCP socket); on error fd is not taken. The connection is registered with
// the next loop's epoll set (Attach) and goes through that loop's first
// output pass, which sends whatever is due (data the socket holds beyond
// what the guest has, a window update).
func (t *Table) Import(now time.Time, state []byte, fd int) error {
	_, err := t.importConn(now, state, fd)
	return err
}

// ImportRestored is Import for a socket made anew from the old one's
// state (TCP repair, a migration across hosts): the new socket counts
// the bytes its peer acknowledges (tcpi_bytes_acked) from zero, starting
// after the sendQueued bytes still in its send queue, where the old one
// had counted since its connect.
func (t *Table) ImportRestored(now time.Time, state []byte, fd int, sendQueued int) error {
	f, err := t.importConn(now, state, fd)
	if err != nil {
		return err
	}
	f.ackBase = f.seqFromGuest - uint32(sendQueued)
	return nil
}

func (t *Table) importConn(now time.Time, state []byte, fd int) (*conn, error) {
	var w connWire
	if len(state) != connWireSize {
		return nil, fmt.Errorf("%d bytes, want %d: %w", len(state), connWireSize, ErrImportState)
	}
	if _, err := binary.Decode(state, binary.LittleEndian, &w); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrImportState, err)
	}
	if err := w.check(); err != nil {
		return nil, err
	}
	if err := checkTCPSocket(fd); err != nil {
		return nil, err
	}
	guest, remote := wireAddr(w.GuestAddr, w.V6), wireAddr(w.RemoteAddr, w.V6)
	key := connKey{guestAddr: guest.As16(), remoteAddr: remote.As16(), guestPort: w.GuestPort, remotePort: w.RemotePort, v6: w.V6}
	if _, busy := t.byKey[key]; busy {
		return nil, fmt.Errorf("%v:%d ↔ %v:%d: %w", guest, w.GuestPort, remote, w.RemotePort, ErrImportTaken)
	}
	f := t.alloc(key)
	if f == nil {
		return nil, fmt.Errorf("table full: %w", ErrImportTaken)
	}
	*f = conn{
		key: key, fd: fd, slot: f.slot, gen: f.gen, fp: f.fp, nextOut: -1,
		events: w.Events, flags: w.Flags,
		guestMAC: w.GuestMAC, guestAddr: guest, remoteAddr: remote, guestPort: w.GuestPort, remotePort: w.RemotePort,
		iss: w.ISS, seqToGuest: w.SeqToGuest, sndMax: w.SndMax, seqAckFromGuest: w.SeqAckFromGuest,
		eofSeq: w.EOFSeq, wndFromGuest: w.WndFromGuest, wsFromGuest: w.WsFrom, mssToGuest: int(w.MSSToGuest),
		dupAcks: w.DupAcks, retrans: w.Retrans,
		seqInitFromGuest: w.SeqInitFromGuest, ackBase: w.AckBase, sndBuf: int(w.SndBuf),
		sndBufAt: since(now, w.SndBufAt), sndRatio: w.SndRatio,
		seqFromGuest: w.SeqFromGuest, seqAckToGuest: w.SeqAckToGuest, ackSent: w.AckSent,
		wndToGuest: w.WndToGuest, wndSent: w.WndSent, maxWndSent: w.MaxWndSent, wsToGuest: w.WsTo,
		dupAckSeq: w.DupAckSeq, dupAckSent: w.DupAckSent, dupAcksDue: w.DupAcksDue, guestSACK: w.GuestSACK,
		epollEvents: w.EpollEvents, inEpoll: w.InEpoll, clamp: int(w.Clamp), recover: w.Recover,
		sackHigh: w.SeqAckFromGuest, created: since(now, w.Created), lastActivity: since(now, w.LastActivity),
		lastAckProg: since(now, w.LastAckProg), ackDueAt: since(now, w.AckDueAt),
		ackCheckIvl: time.Duration(min(max(w.AckCheckIvl, 0), int64(maxAge))),
	}
	// The exporter's choice of peek offset lives on in the socket (-1:
	// not set, the discard-buffer fallback).
	off, err := hostsock.GetInt(fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF)
	f.peekOff = err == nil && off >= 0
	if st := stats.TCPState(w.State); st == stats.TCPEstablished || st == stats.TCPClosing {
		inlineUrgent(fd) // a socket rebuilt by TCP_REPAIR has lost it
	}
	t.setState(f, stats.TCPState(w.State))
	if f.inEpoll {
		// Registered now or by the next Attach (a migration imports
		// detached) with what its state asks here, not the exporter's
		// mask: EPOLLPRI is not carried (Export), and without it urgent
		// data behind a short read would wait for the peer's next segment.
		f.epollEvents = t.epollWant(f)
	} else {
		f.epollEvents = 0
	}
	if f.flags&flStalled != 0 {
		t.stats.Stalled.Add(1)
	}
	if t.poll != nil {
		f.inEpoll = false
		t.updateEpoll(f)
	}
	t.markDirty(f)
	t.noteDeadline(f)
	t.qstats.Flows.MovedIn[stats.FlowTCP].Add(1)
	return f, nil
}

// check refuses a state no connection of this table could be in.
func (w *connWire) check() error {
	bad := func(what string, v any) error { return fmt.Errorf("%s %v: %w", what, v, ErrImportState) }
	switch {
	case w.Version != connStateVersion:
		return bad("version", w.Version)
	case w.State == uint8(stats.TCPFree) || w.State >= uint8(stats.NumTCPStates) || w.State == uint8(stats.TCPResetting):
		return bad("state", w.State)
	case w.Events&^eventsKnown != 0:
		return bad("events", w.Events)
	case w.Flags&^flagsKnown != 0 || w.Flags&(flDirty|flRstDue) != 0:
		return bad("flags", w.Flags)
	case w.GuestPort == 0 || w.RemotePort == 0:
		return bad("ports", [2]uint16{w.GuestPort, w.RemotePort})
	case w.MSSToGuest == 0 || w.MSSToGuest > 65535:
		return bad("mss", w.MSSToGuest)
	case w.WsFrom > 14 || w.WsTo > 14:
		return bad("window scale", [2]uint8{w.WsFrom, w.WsTo})
	case w.SndBuf < 0 || w.SndBuf > 1<<31 || w.Clamp < 0 || w.Clamp > 1<<31:
		return bad("buffer sizes", [2]int64{w.SndBuf, w.Clamp})
	case w.EpollEvents&^(unix.EPOLLIN|unix.EPOLLOUT|unix.EPOLLRDHUP|unix.EPOLLPRI|unix.EPOLLET) != 0:
		return bad("epoll events", w.EpollEvents)
	}
	for _, a := range [][16]byte{w.GuestAddr, w.RemoteAddr} {
		x := wireAddr(a, w.V6)
		if netip.AddrFrom16(a).Is4In6() == w.V6 || x.IsUnspecified() || x.IsMulticast() {
			return bad("address", x)
		}
	}
	return nil
}

// checkTCPSocket makes sure fd is a TCP socket: whatever else a peer sends
// (a pipe, a UDP socket, a listener) the table must not take for one.
func checkTCPSocket(fd int) error {
	if fd < 0 {
		return fmt.Errorf("no socket: %w", ErrImportState)
	}
	typ, proto, err := hostsock.SocketKind(fd)
	if err != nil {
		return fmt.Errorf("socket: %w: %w", ErrImportState, err)
	}
	if typ != unix.SOCK_STREAM || proto != unix.IPPROTO_TCP {
		return fmt.Errorf("descriptor is not a TCP socket (type %d, protocol %d): %w", typ, proto, ErrImportState)
	}
	if listening, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || listening != 0 {
		return fmt.Errorf("a listening socket: %w", ErrImportState)
	}
	return nil
}

func wireAddr(b [16]byte, v6 bool) netip.Addr {
	a := netip.AddrFrom16(b)
	if !v6 {
		a = a.Unmap()
	}
	return a
}

// age encodes t as its age at now (noTime for a zero time).
func age(now, t time.Time) int64 {
	if t.IsZero() {
		return noTime
	}
	return int64(now.Sub(t))
}

// since decodes an age back into a time of this process's clock.
func since(now time.Time, a int64) time.Time {
	if a == noTime {
		return time.Time{}
	}
	return now.Add(-time.Duration(min(max(a, -int64(maxAge)), int64(maxAge))))
}

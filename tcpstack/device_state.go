package tcpstack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/flowdir"
	"vunet/tcpstack/handover"
	"vunet/tcpstack/hostsock"
)

// The migration across hosts, as far as it can go: the front-end carries
// the back-end's state in its own migration stream (vhost-user
// VHOST_USER_PROTOCOL_F_DEVICE_STATE, a newer QEMU than 7.2), so no socket
// can travel. A TCP connection then travels as its socket's whole state,
// read out in TCP repair mode, and the destination makes a new socket of
// it (tcpstack/hostsock, TCP repair). Repair mode needs CAP_NET_ADMIN,
// which only the separate helper holds (--repair-path, cmd/vunet-repair);
// without one, connections stay with the source. UDP and ping flows are
// not carried: the guest's next datagram opens a new flow (a new host
// port), replies in flight are lost.
//
// The source closes the sockets it read out (in repair mode, silently) and
// keeps what it sent: if the rings start at the source again (the
// migration failed), it makes the connections again from it. Nothing
// stops a peer's segment from reaching the source host while no socket
// holds the connection, which its kernel answers with a reset; on one host
// the hand-over channel (--migrate-to/--migrate-from), which moves the
// open sockets themselves, has no such gap.

// SetRepairHelper gives the Stack the channel to the TCP_REPAIR helper
// (--repair-path): with it, SaveState carries TCP connections and
// LoadState makes them again.
func (s *Stack) SetRepairHelper(h *hostsock.RepairHelper) {
	s.mu.Lock()
	s.repair = h
	s.mu.Unlock()
}

// SaveState implements virtqueue.StateTransfer on a migration's source:
// with every pair stopped, the guest's TCP connections are read out of
// their sockets (through the repair helper) and written to w, and the
// sockets closed.
func (s *Stack) SaveState(w io.Writer) error {
	now := time.Now()
	s.mu.Lock()
	if len(s.loops) != 0 {
		s.mu.Unlock()
		return errors.New("save state: queue pairs still run")
	}
	if len(s.stopping) != 0 {
		// A loop abandoned at a stop deadline (vhost-user's, in this
		// session or an earlier one) may wake and use its pair's
		// mailbox and tables, which saving reads and empties.
		s.mu.Unlock()
		return errors.New("save state: a queue pair that did not stop still holds its flows")
	}
	s.mig.mu.Lock()
	handedOver := s.mig.sent != nil
	s.mig.mu.Unlock()
	// Connections on their way between pairs are saved too.
	s.settleMovesLocked()
	var items []handover.Item
	saved, kept := 0, 0
	for p, ps := range s.pairs {
		ex := ps.tcp.Export(now)
		if len(ex) == 0 {
			continue
		}
		if handedOver || s.repair == nil {
			kept += len(ex)
			continue
		}
		fds := make([]int, len(ex))
		for i, e := range ex {
			fds[i] = e.FD
		}
		if err := s.repair.Set(fds, hostsock.RepairOn); err != nil {
			s.log.Error("migration: TCP repair mode refused: connections stay here", "err", err)
			kept += len(ex)
			continue
		}
		var failed []int
		var dumped = ex[:0:0]
		for _, e := range ex {
			st, err := hostsock.DumpTCP(e.FD)
			var rb []byte
			if err == nil {
				rb, err = st.MarshalBinary()
			}
			if err != nil {
				s.log.Warn("migration: a TCP connection could not be read out: it stays here", "err", err)
				failed = append(failed, e.FD)
				continue
			}
			data := binary.LittleEndian.AppendUint32(nil, uint32(len(e.State)))
			data = append(append(data, e.State...), rb...)
			items = append(items, handover.Item{Kind: handover.KindTCP, Pair: uint16(p), Data: data, FD: -1})
			dumped = append(dumped, e)
		}
		if len(failed) > 0 {
			if err := s.repair.Set(failed, hostsock.RepairOff); err != nil {
				s.log.Error("migration: TCP repair mode stuck on", "err", err)
			}
		}
		// Closed in repair mode: the peers hear nothing.
		ps.tcp.Detach()
		saved += ps.tcp.Forget(dumped)
		kept += len(failed)
	}
	s.saved = items
	s.mu.Unlock()
	switch {
	case handedOver:
		s.log.Info("migration: device state saved; the connections went over on this host", "tcp_connections", kept)
	case s.repair == nil && kept > 0:
		s.log.Warn("migration: device state saved without TCP connections: no TCP_REPAIR helper (--repair-path)", "kept", kept)
	default:
		s.log.Info("migration: device state saved", "tcp_connections", saved, "kept", kept)
	}
	return handover.WriteStream(w, items)
}

// LoadState implements virtqueue.StateTransfer on a migration's
// destination: the connections in r are made again (through the repair
// helper) into the pairs' tables, before their loops start.
func (s *Stack) LoadState(r io.Reader) error {
	items, err := handover.ReadStream(r)
	if err != nil {
		return fmt.Errorf("load state: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	restored, refused := s.restoreLocked(items)
	s.log.Info("migration: device state loaded", "tcp_connections", restored, "refused", refused)
	return nil
}

// restoreLocked makes the TCP connections of items again, with s.mu held;
// pairs that run are left alone (their connections refused).
func (s *Stack) restoreLocked(items []handover.Item) (restored, refused int) {
	now := time.Now()
	var live []int
	for _, it := range items {
		if it.Kind != handover.KindTCP {
			continue
		}
		if err := s.restoreConn(now, it, &live); err != nil {
			refused++
			s.log.Warn("migration: TCP connection not restored", "pair", it.Pair, "err", err)
			continue
		}
		restored++
	}
	if len(live) > 0 {
		// Out of repair mode: the connections go on (with a window
		// probe, so a peer that waits hears from them at once).
		if err := s.repair.Set(live, hostsock.RepairOff); err != nil {
			s.log.Error("migration: TCP repair mode stuck on", "err", err)
		}
	}
	return restored, refused
}

func (s *Stack) restoreConn(now time.Time, it handover.Item, live *[]int) error {
	if s.repair == nil {
		return errors.New("no TCP_REPAIR helper (--repair-path)")
	}
	// A pair number is checked before anything is made for it: each new
	// one costs a pair's tables, and the stream comes from another host.
	if int(it.Pair) >= flowdir.MaxPairs {
		return fmt.Errorf("connection item for pair %d, at most %d pairs", it.Pair, flowdir.MaxPairs)
	}
	if _, running := s.loops[int(it.Pair)]; running {
		return errors.New("the pair already runs")
	}
	if len(it.Data) < 4 || int(binary.LittleEndian.Uint32(it.Data)) > len(it.Data)-4 {
		return errors.New("malformed connection item")
	}
	n := binary.LittleEndian.Uint32(it.Data)
	state, rest := it.Data[4:4+n], it.Data[4+n:]
	var st hostsock.TCPRepairState
	if err := st.UnmarshalBinary(rest); err != nil {
		return err
	}
	fd, err := hostsock.RestoreTCP(&st, func(fd int) error { return s.repair.Set([]int{fd}, hostsock.RepairOn) })
	if err != nil {
		return err
	}
	ps, err := s.pairStateLocked(int(it.Pair))
	if err != nil {
		unix.Close(fd)
		return err
	}
	ps.tcp.Detach()
	if err := ps.tcp.ImportRestored(now, state, fd, len(st.SendQueue)); err != nil {
		// Still in repair mode: closing it sends nothing.
		unix.Close(fd)
		return err
	}
	*live = append(*live, fd)
	return nil
}

// resumeSaved is called by StartPair: the rings run here again after a
// SaveState (the migration failed), so the connections it read out are
// made again here.
func (s *Stack) resumeSavedLocked() {
	items := s.saved
	s.saved = nil
	if len(items) == 0 {
		return
	}
	restored, refused := s.restoreLocked(items)
	s.log.Info("migration: the guest runs here again; its connections were made again",
		"tcp_connections", restored, "refused", refused)
}

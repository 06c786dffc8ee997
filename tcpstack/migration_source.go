package tcpstack

import (
	"errors"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/dgram"
	"vunet/tcpstack/handover"
	"vunet/tcpstack/tcp"
)

// The source side of a migration (see migration.go): the flows are handed
// out when the rings stop, and forgotten at the destination's COMMIT.

// commitWait bounds how long a source whose front-end left (QEMU quits
// after a migration) waits for the destination's COMMIT before it ends
// the session: resetting flows the destination took would reset them for
// the destination's guest too.
const commitWait = 3 * time.Second

// sentFlows is what the source handed out, per pair.
type sentFlows struct {
	conn  *handover.Conn
	tcp   map[int][]tcp.Exported
	dgram map[int][]dgram.Exported
}

// ServeMigration accepts destination vunets on l (--migrate-to) until l is
// closed. The newest destination is the one the flows go to.
func (s *Stack) ServeMigration(l *net.UnixListener) {
	go func() {
		for {
			c, err := handover.Accept(l)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				s.log.Warn("migration: destination refused", "err", err)
				continue
			}
			s.mig.mu.Lock()
			old := s.mig.dest
			s.mig.dest = c
			s.mig.mu.Unlock()
			if old != nil {
				old.Close()
			}
			s.log.Info("migration: destination vunet connected; the guest's flows follow it when QEMU migrates the guest")
			go s.readDestination(c)
		}
	}()
}

// readDestination waits for the destination's COMMIT on c.
func (s *Stack) readDestination(c *handover.Conn) {
	for {
		ev, err := c.Receive()
		if err != nil {
			if !handover.IsClosed(err) {
				s.log.Warn("migration: destination channel", "err", err)
			}
			s.mig.mu.Lock()
			if s.mig.dest == c {
				s.mig.dest = nil
			}
			s.mig.mu.Unlock()
			s.giveUpSent(c, "destination gone before it took the flows")
			c.Close()
			return
		}
		if ev.Commit {
			s.commitSent(c)
			continue
		}
		// A destination sends nothing else.
		closeItems(ev.Items)
		s.log.Warn("migration: unexpected message from the destination")
	}
}

// MigrationStopped implements virtqueue.Migrator: every ring stopped while
// the front-end migrates the guest. The flows' state goes to the
// destination, if one is connected.
func (s *Stack) MigrationStopped() {
	now := time.Now()
	s.mu.Lock()
	s.mig.mu.Lock()
	dest := s.mig.dest
	stuck := len(s.stopping) != 0
	if dest == nil || s.mig.sent != nil || len(s.loops) != 0 || stuck {
		s.mig.mu.Unlock()
		s.mu.Unlock()
		switch {
		case dest == nil:
			s.log.Info("migration: rings stopped, no destination vunet connected (--migrate-to): open connections stay here")
		case stuck:
			// Its loop may wake and use the tables a hand-over reads.
			s.log.Warn("migration: a queue pair that did not stop still holds its flows: open connections stay here")
		}
		return
	}
	// Flows on their way between pairs go to the destination too.
	s.settleMovesLocked()
	sent := &sentFlows{conn: dest, tcp: map[int][]tcp.Exported{}, dgram: map[int][]dgram.Exported{}}
	var items []handover.Item
	var dups []int
	add := func(kind handover.Kind, pair int, state []byte, fd int) {
		// A duplicate is sent: the table may close its own descriptor
		// while the send runs (a pair restarted, a failed migration).
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			s.log.Warn("migration: duplicate a flow's socket", "err", err)
			return
		}
		dups = append(dups, d)
		items = append(items, handover.Item{Kind: kind, Pair: uint16(pair), Data: state, FD: d})
	}
	nTCP, nFlows := 0, 0
	for p, ps := range s.pairs {
		ex := ps.tcp.Export(now)
		sent.tcp[p] = ex
		for _, e := range ex {
			add(handover.KindTCP, p, e.State, e.FD)
		}
		fx := ps.flows.Export(now)
		sent.dgram[p] = fx
		for _, e := range fx {
			add(handover.KindDgram, p, e.State, e.FD)
		}
		nTCP += len(ex)
		nFlows += len(fx)
	}
	s.mig.sent = sent
	s.mig.resolved = make(chan struct{})
	s.mig.mu.Unlock()
	s.mu.Unlock()
	s.log.Info("migration: rings stopped, handing the guest's flows to the destination",
		"tcp_connections", nTCP, "flows", nFlows)
	go func() {
		err := dest.SendState(items)
		for _, d := range dups {
			unix.Close(d)
		}
		if err != nil {
			s.log.Error("migration: sending the flows failed: they stay here", "err", err)
			s.giveUpSent(dest, "send failed")
		}
	}()
}

// commitSent forgets the flows the destination took.
func (s *Stack) commitSent(c *handover.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	sent := s.mig.sent
	if sent == nil || sent.conn != c {
		s.log.Warn("migration: COMMIT for nothing handed out")
		return
	}
	nTCP, nFlows := 0, 0
	for p, ex := range sent.tcp {
		if s.loops[p] != nil {
			// Only a front-end that runs the guest in two places gets
			// here; the flows stay with this side.
			s.log.Error("migration: COMMIT while the pair runs here; flows kept", "pair", p)
			continue
		}
		ps := s.pairs[p]
		ps.tcp.Detach() // its last loop's epoll set is closed
		nTCP += ps.tcp.Forget(ex)
		nFlows += ps.flows.Forget(sent.dgram[p])
	}
	s.mig.sent = nil
	close(s.mig.resolved)
	s.log.Info("migration: the destination took the guest's flows", "tcp_connections", nTCP, "flows", nFlows)
}

// giveUpSent keeps the flows handed out on c here.
func (s *Stack) giveUpSent(c *handover.Conn, why string) {
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	if s.mig.sent == nil || s.mig.sent.conn != c {
		return
	}
	s.mig.sent = nil
	close(s.mig.resolved)
	s.log.Info("migration: flows stay here", "why", why)
}

// resumeHere is called by StartPair on a source: rings run here again, so
// a state handed out and not taken is stale.
func (s *Stack) resumeHere() {
	s.mig.mu.Lock()
	sent := s.mig.sent
	s.mig.mu.Unlock()
	if sent == nil {
		return
	}
	s.giveUpSent(sent.conn, "the rings run here again (migration failed or cancelled)")
	go func() {
		if err := sent.conn.SendAbort(); err != nil {
			s.log.Warn("migration: ABORT to the destination", "err", err)
		}
	}()
}

// awaitCommit waits (bounded) for a hand-over in flight to be resolved
// before the session's flows are reset.
func (s *Stack) awaitCommit() {
	s.mig.mu.Lock()
	ch := s.mig.resolved
	pending := s.mig.sent != nil
	s.mig.mu.Unlock()
	if !pending {
		return
	}
	select {
	case <-ch:
	case <-time.After(commitWait):
		s.log.Warn("migration: no COMMIT from the destination before the session ended")
	}
}

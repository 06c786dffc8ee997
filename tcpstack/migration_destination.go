package tcpstack

import (
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/handover"
)

// The destination side of a migration (see migration.go): the flows are
// received whenever they come, and imported at the first pair start.

// arrivalWait bounds how long the first pair start on a destination waits
// for a state that has not arrived yet: the source sends it when QEMU stops
// its rings, before QEMU resumes the guest here, so it is normally there.
const arrivalWait = 2 * time.Second

// MigrateFrom makes this Stack a migration destination: c is the channel to
// the source vunet (--migrate-from, connected at start-up). The flows it
// sends are taken over at the first pair start.
func (s *Stack) MigrateFrom(c *handover.Conn) {
	s.mig.mu.Lock()
	s.mig.from = c
	s.mig.arrived = make(chan struct{})
	s.mig.mu.Unlock()
	go s.readSource(c)
}

// readSource receives the source's states and ABORTs.
func (s *Stack) readSource(c *handover.Conn) {
	for {
		ev, err := c.Receive()
		s.mig.mu.Lock()
		switch {
		case err != nil:
			if !handover.IsClosed(err) {
				s.log.Warn("migration: source channel", "err", err)
			}
			s.closeArrived()
			s.mig.mu.Unlock()
			return
		case ev.Abort:
			closeItems(s.mig.pending)
			s.mig.pending = nil
			if s.arrivedClosed() && !s.mig.tookOver {
				s.mig.arrived = make(chan struct{})
			}
			s.log.Info("migration: the source resumed the guest; its flows stay there")
		case ev.Commit:
			s.log.Warn("migration: unexpected COMMIT from the source")
		case s.mig.tookOver:
			closeItems(ev.Items)
			s.log.Error("migration: flows arrived after the guest started here: dropped", "items", len(ev.Items))
		default:
			closeItems(s.mig.pending)
			s.mig.pending = ev.Items
			s.closeArrived()
			s.log.Info("migration: the guest's flows arrived from the source", "items", len(ev.Items))
		}
		s.mig.mu.Unlock()
	}
}

func (s *Stack) arrivedClosed() bool {
	select {
	case <-s.mig.arrived:
		return true
	default:
		return false
	}
}

// closeArrived marks the state as arrived (s.mig.mu held).
func (s *Stack) closeArrived() {
	if !s.arrivedClosed() {
		close(s.mig.arrived)
	}
}

// awaitArrival is called by StartPair on a destination before it takes
// s.mu: the first pair start waits, bounded, for a state on its way.
func (s *Stack) awaitArrival() {
	s.mig.mu.Lock()
	ch := s.mig.arrived
	wait := s.mig.from != nil && !s.mig.waited && !s.mig.tookOver
	s.mig.waited = true
	s.mig.mu.Unlock()
	if !wait {
		return
	}
	select {
	case <-ch:
	case <-time.After(arrivalWait):
		s.log.Warn("migration: no flows from the source yet; the guest starts here without them")
	}
}

// importPending moves the pending flows of pair p into ps's tables, with
// s.mu held and the pair's loop not yet started; the first import COMMITs.
func (s *Stack) importPending(p int, ps *pairState) {
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	if s.mig.from == nil || len(s.mig.pending) == 0 && (s.mig.tookOver || !s.arrivedClosed()) {
		return
	}
	now := time.Now()
	ps.tcp.Detach() // its last loop's epoll set is closed; the next one registers
	rest := s.mig.pending[:0]
	nTCP, nFlows, bad := 0, 0, 0
	for _, it := range s.mig.pending {
		if int(it.Pair) != p {
			rest = append(rest, it)
			continue
		}
		var err error
		switch it.Kind {
		case handover.KindTCP:
			err = ps.tcp.Import(now, it.Data, it.FD)
			nTCP++
		case handover.KindDgram:
			err = ps.flows.Import(now, it.Data, it.FD)
			nFlows++
		}
		if err != nil {
			bad++
			if it.FD >= 0 {
				unix.Close(it.FD)
			}
			s.log.Warn("migration: flow not taken over", "pair", p, "err", err)
		}
	}
	s.mig.pending = rest
	if nTCP+nFlows > 0 || !s.mig.tookOver {
		s.log.Info("migration: flows taken over from the source", "pair", p,
			"tcp_connections", nTCP-bad, "flows", nFlows, "refused", bad)
	}
	if !s.mig.tookOver {
		s.mig.tookOver = true
		c := s.mig.from
		go func() {
			if err := c.SendCommit(); err != nil {
				s.log.Warn("migration: COMMIT to the source", "err", err)
			}
		}()
	}
}

// dropPending closes flows received and never imported (the session ended).
func (s *Stack) dropPending() {
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	closeItems(s.mig.pending)
	s.mig.pending = nil
}

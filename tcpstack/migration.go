package tcpstack

import (
	"errors"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/dgram"
	"vunet/tcpstack/handover"
	"vunet/tcpstack/tcp"
)

// Live migration on one host: the guest's flows follow it from this Stack
// (the source, --migrate-to) to the Stack of the destination's vunet
// (--migrate-from), over a handover channel the destination opened at its
// start. The sockets are not reopened: the same open sockets move
// (SCM_RIGHTS), with each flow's state, so the host peers see nothing and
// the guest's TCP connections go on where they were.
//
//   - Source: when the control plane reports that every ring stopped while
//     the front-end migrates (MigrationStopped: QEMU's stop-and-copy), the
//     pairs' tables export their flows and the state goes to the
//     destination in the background. The flows stay in the tables, frozen
//     (no loop runs), until the destination COMMITs; then the tables forget
//     them (closing only our descriptors). If the rings start here again
//     first (the migration failed and the guest runs on), the destination
//     is told to ABORT and the flows simply go on here.
//   - Destination: the state is received whenever it comes and held; the
//     first pair start (the guest runs here: the migration completed) waits
//     a little for it if it has not come yet, imports each pair's flows
//     into its tables before the pair's loop registers their sockets, and
//     COMMITs.
//
// A destination vunet's front-end starts the pairs only after the source's
// stopped (QEMU resumes the guest there only then), so the two processes
// never use a socket at the same time.

// arrivalWait bounds how long the first pair start on a destination waits
// for a state that has not arrived yet: the source sends it when QEMU stops
// its rings, before QEMU resumes the guest here, so it is normally there.
const arrivalWait = 2 * time.Second

// commitWait bounds how long a source whose front-end left (QEMU quits
// after a migration) waits for the destination's COMMIT before it ends
// the session: resetting flows the destination took would reset them for
// the destination's guest too.
const commitWait = 3 * time.Second

// migration is a Stack's hand-over state, both roles.
type migration struct {
	mu sync.Mutex

	// Source.
	dest     *handover.Conn // the connected destination (the newest)
	sent     *sentFlows     // handed out, waiting for COMMIT
	resolved chan struct{}  // closed when sent was committed or given up

	// Destination.
	from     *handover.Conn
	pending  []handover.Item // received, not imported yet
	arrived  chan struct{}   // closed when a state arrived or the channel failed
	waited   bool            // a pair start already waited for it once
	tookOver bool            // imported and COMMITted
}

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
		for _, it := range ev.Items {
			if it.FD >= 0 {
				unix.Close(it.FD)
			}
		}
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
	if dest == nil || s.mig.sent != nil || len(s.loops) != 0 {
		s.mig.mu.Unlock()
		s.mu.Unlock()
		if dest == nil {
			s.log.Info("migration: rings stopped, no destination vunet connected (--migrate-to): open connections stay here")
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

func closeItems(items []handover.Item) {
	for _, it := range items {
		if it.FD >= 0 {
			unix.Close(it.FD)
		}
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

// closeMigration closes the hand-over channels (Stack.Close).
func (s *Stack) closeMigration() {
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	for _, c := range []*handover.Conn{s.mig.dest, s.mig.from} {
		if c != nil {
			c.Close()
		}
	}
	closeItems(s.mig.pending)
	s.mig.pending = nil
}

package tcpstack

import (
	"sync"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/handover"
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

// closeItems closes the descriptors that came with items.
func closeItems(items []handover.Item) {
	for _, it := range items {
		if it.FD >= 0 {
			unix.Close(it.FD)
		}
	}
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

package tcpstack

import (
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// How a loop ends: it leaves the rings consistent for the control plane,
// and a fault on guest memory (the front-end shrank the file under us)
// stops it without taking the process down.

// stop asks the loop to finish and waits until it has left the rings.
func (l *loop) stop() {
	l.quit.Store(true)
	l.wake()
	<-l.done
	unix.Close(l.wakefd)
	l.wakefd = -1
}

// shutdown leaves the rings consistent for GET_VRING_BASE and a restart
// (used.idx catches up with LastAvail): every TX chain was pushed in its
// batch and is flushed; RX reservations are rewound and
// pushed chains published. Pending replies are dropped with the loop
// (counted, announcements excepted).
func (l *loop) shutdown() {
	if !l.faulted {
		l.leaveRings()
	}
	// Announcements are made again at the next start: not drops.
	if n := l.pending.replies(); n > 0 {
		l.st.RX.Drops[stats.DropRingDisabled].Add(uint64(n))
	}
	// Requests posted before the loop ended run here, the last ones.
	l.runRequests(true)
	l.flows.Detach()
	l.tcp.Detach()
	l.ps.loop = nil
	l.tx.fetch = txFetch{} // the chains went back (leaveRings); the next loop fetches again
	if l.stream == nil {
		// The kicks were watched edge-triggered and never read: clear
		// them, or the front-end, taking the rings back, finds kicks
		// that this loop already served.
		l.qp.TX.DrainKick()
		l.qp.RX.DrainKick()
		// What leaveRings and the last requests published is signalled
		// now, and the control path's Flushes signal at once again.
		l.qp.RX.DeferSignals(false)
		l.qp.TX.DeferSignals(false)
	}
	l.closeFDs()
}

// leaveRings publishes what the loop holds on the rings. Guest memory can
// fault here too (shrunk just as the pair stops).
func (l *loop) leaveRings() {
	defer l.recoverFault()
	l.out.Publish()
	if l.stream != nil {
		return // no rings: what the socket did not take goes with the session
	}
	// TX chains still popped (a batch waiting for a flow from another
	// pair) are given back untouched: the next loop pops them again. Not
	// those popped before a bad chain: Pop already returned that one as
	// used, and LastAvail rewound across it would have the next queue,
	// rebuilt from it (GET_VRING_BASE), take it and use it again
	// (used.idx past the base). They go back to the guest unsent, as
	// frames on a ring being disabled.
	if l.tx.n > l.tx.next {
		for ; l.tx.next < l.tx.pinned; l.tx.next++ {
			l.qp.TX.Push(l.tx.chains[l.tx.next].Head, 0)
			l.st.TX.Drops[stats.DropRingDisabled].Add(1)
		}
		l.qp.TX.Unpop(l.tx.n - l.tx.next)
	}
	l.tx.n, l.tx.next, l.tx.pinned = 0, 0, 0
	// TX chains are flushed per batch, but bad chains Pop staged after the
	// last batch's Flush would be counted in LastAvail and never reach
	// used.idx.
	if l.qp.TX.Staged() > 0 {
		l.st.TX.Batches.Add(1) // before Flush: counters never lag the ring
		l.qp.TX.Flush()
	}
}

// recoverFault, deferred, turns a fault on guest memory into a stopped
// loop: the pair is marked faulted so nothing touches its rings again,
// the fault is counted and logged (rate-limited per Stack: a front-end
// can make every rebuilt loop fault). Any other panic is a bug and goes
// on.
func (l *loop) recoverFault() {
	r := recover()
	if r == nil {
		return
	}
	fault, ok := r.(interface{ Addr() uintptr })
	if !ok {
		panic(r)
	}
	if l.stream != nil {
		panic(r) // no guest memory on a stream: a fault is a bug
	}
	l.faulted = true
	// A run of guest data gathered, or datagrams queued, before the fault
	// point into memory that may not be ours any more: the guest sends
	// TCP data again; UDP never promised delivery.
	l.tcp.DropSends()
	l.flows.DropSends()
	n := l.st.MemoryFaults.Add(1)
	l.s.logMemoryFault(l.log, fault.Addr(), n)
	// The front-end learns of it through the vrings' error eventfds
	// (touching no guest memory).
	for _, q := range [...]*virtqueue.SplitQueue{l.qp.RX, l.qp.TX} {
		if err := q.SignalErr(); err != nil {
			l.log.Warn("signal vring error fd", "err", err)
		}
	}
}

// memoryFaultLogInterval bounds how often memory faults are logged.
const memoryFaultLogInterval = 5 * time.Second

func (s *Stack) logMemoryFault(log *slog.Logger, addr uintptr, faults uint64) {
	if ok, _ := s.faultLog.Allow(time.Now(), memoryFaultLogInterval); !ok {
		return
	}
	log.Error("guest memory fault: queue pair stopped until the front-end rebuilds it "+
		"(the front-end shrank or unmapped guest memory)",
		"addr", fmt.Sprintf("%#x", addr), "faults", faults)
}

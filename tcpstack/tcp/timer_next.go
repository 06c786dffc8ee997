package tcp

import "time"

// The table's next deadline, kept exact where that is cheap.
//
// Deadlines are noted as they are set (noteDeadline lowers nextTimer), but
// an ACK that cancels one — the tail-loss probe, the ACK timeout of data
// now acknowledged — does not raise it. Left alone, the timer fires for
// nothing: under a QEMU guest downloading, whose ACKs come every few
// milliseconds and whose window keeps a full flight in flight, the probe
// armed by each flight fired after the guest had ACKed it, one wake-up in
// four of the loop's, each a context switch.
// So the table remembers which flow set nextTimer, and when that flow's
// deadline moves later or the flow goes, NextTimer finds the earliest
// deadline again: a scan of the active flows, done only while they are
// few (timerRescanMax). With many flows the scan would cost more than the
// spurious wake-up, which Timers' full pass then corrects.

// timerRescanMax is the most active flows NextTimer scans to correct a
// stale deadline.
const timerRescanMax = 128

// noteTimer lowers the table's next deadline to d, which is not a flow's
// (the listeners' retry).
func (t *Table) noteTimer(d time.Time) {
	if !d.IsZero() && (t.nextTimer.IsZero() || d.Before(t.nextTimer)) {
		t.nextTimer, t.timerOwner = d, -1
	}
}

// noteDeadline takes f's deadline into the table's next one, after
// anything that may have moved it.
func (t *Table) noteDeadline(f *conn) {
	d := t.deadline(f)
	if f.slot == t.timerOwner && (d.IsZero() || d.After(t.nextTimer)) {
		t.timerStale = true
	}
	if !d.IsZero() && (t.nextTimer.IsZero() || d.Before(t.nextTimer)) {
		t.nextTimer, t.timerOwner, t.timerStale = d, f.slot, false
	}
}

// flowGone is called when f's slot is freed: its deadline goes with it.
func (t *Table) flowGone(f *conn) {
	if f.slot == t.timerOwner {
		t.timerStale = true
	}
}

// NextTimer returns the earliest deadline of any connection; zero means
// none. The loop's next wait ends there at the latest (its timeout), and
// the loop calls Timers once it has passed. It may be early (see above),
// never late.
func (t *Table) NextTimer() time.Time {
	if t.timerStale && len(t.active) <= timerRescanMax {
		t.rescanTimers()
	}
	return t.nextTimer
}

// rescanTimers sets nextTimer to the earliest deadline there is.
func (t *Table) rescanTimers() {
	t.nextTimer, t.timerOwner, t.timerStale = t.acceptRetry, -1, false
	for _, s := range t.active {
		f := &t.flows[s]
		if d := t.deadline(f); !d.IsZero() && (t.nextTimer.IsZero() || d.Before(t.nextTimer)) {
			t.nextTimer, t.timerOwner = d, s
		}
	}
}

package stats

import (
	"sync/atomic"
	"time"
)

// Limiter bounds how often a kind of log line that a guest or front-end can
// provoke at will is written: at most one per interval, and the line that
// goes out says how many were held back since the previous one. It is safe
// for concurrent use (a limiter shared by a Stack's loops) and does not
// allocate; the zero value lets the first line through.
type Limiter struct {
	last       atomic.Int64 // unix nanoseconds of the last line let through; 0: none yet
	suppressed atomic.Uint64
}

// Allow reports whether a line may be written at now, at most one per
// interval; if so, suppressed is the number of lines held back since the
// previous one.
func (l *Limiter) Allow(now time.Time, interval time.Duration) (ok bool, suppressed uint64) {
	t := now.UnixNano()
	last := l.last.Load()
	if last != 0 && t-last < int64(interval) || !l.last.CompareAndSwap(last, t) {
		l.suppressed.Add(1)
		return false, 0
	}
	return true, l.suppressed.Swap(0)
}

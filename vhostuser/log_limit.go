package vhostuser

import "time"

// warnInterval bounds how often one kind of warning a peer can provoke at
// will (unknown requests, refused connections) is logged.
const warnInterval = time.Second

// logLimiter lets one line through per warnInterval and counts the lines
// it held back. It is used by one goroutine (a session's, or Serve's
// accept loop).
type logLimiter struct {
	last       time.Time
	suppressed uint64
}

// allow reports whether a line may be logged now; if so, suppressed is the
// number of lines held back since the previous one.
func (l *logLimiter) allow(now time.Time) (ok bool, suppressed uint64) {
	if !l.last.IsZero() && now.Sub(l.last) < warnInterval {
		l.suppressed++
		return false, 0
	}
	suppressed = l.suppressed
	l.last, l.suppressed = now, 0
	return true, suppressed
}

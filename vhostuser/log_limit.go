package vhostuser

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

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

// Control-plane lines a front-end can provoke at will — a queue pair
// started on every SET_VRING_ENABLE toggle, features negotiated on every
// SET_FEATURES, a session's end on every connection — go through a handler
// that lets each message (by its text) through in bursts of lineBurst,
// then lineRate per second, and adds how many were held back to the next
// line that passes. A normal start-up logs every line; 10,000 toggles log
// a few dozen. Debug lines are not limited: debug output is asked for.
const (
	lineBurst = 20
	lineRate  = 1.0 // per second
	// maxLineKinds bounds the per-message state: messages beyond it share
	// one bucket (messages are constant texts, so this is a safety net).
	maxLineKinds = 256
)

type lineBucket struct {
	tokens     float64
	last       time.Time
	suppressed uint64
}

// lineLimiter is shared by every logger derived from one limitedHandler
// (With, WithGroup) and by every session of a Serve.
type lineLimiter struct {
	mu      sync.Mutex
	buckets map[string]*lineBucket
	other   lineBucket
}

func (l *lineLimiter) allow(msg string, now time.Time) (ok bool, suppressed uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[msg]
	if b == nil {
		if len(l.buckets) < maxLineKinds {
			b = &lineBucket{tokens: lineBurst, last: now}
			l.buckets[msg] = b
		} else {
			b = &l.other
		}
	}
	b.tokens = min(lineBurst, b.tokens+now.Sub(b.last).Seconds()*lineRate)
	b.last = now
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	suppressed, b.suppressed = b.suppressed, 0
	return true, suppressed
}

type limitedHandler struct {
	inner slog.Handler
	lim   *lineLimiter
}

// limitLogger returns a logger over l's handler that rate-limits each
// message. A logger it made is returned as is.
func limitLogger(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(*limitedHandler); ok {
		return l
	}
	return slog.New(&limitedHandler{inner: l.Handler(), lim: &lineLimiter{buckets: map[string]*lineBucket{}}})
}

func (h *limitedHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

func (h *limitedHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo {
		// Debug output is asked for, and the start-up sequence at
		// debug level is worth every line.
		return h.inner.Handle(ctx, r)
	}
	now := r.Time
	if now.IsZero() {
		now = time.Now()
	}
	ok, suppressed := h.lim.allow(r.Message, now)
	if !ok {
		return nil
	}
	if suppressed > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Uint64("lines_suppressed", suppressed))
	}
	return h.inner.Handle(ctx, r)
}

func (h *limitedHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &limitedHandler{inner: h.inner.WithAttrs(attrs), lim: h.lim}
}

func (h *limitedHandler) WithGroup(name string) slog.Handler {
	return &limitedHandler{inner: h.inner.WithGroup(name), lim: h.lim}
}

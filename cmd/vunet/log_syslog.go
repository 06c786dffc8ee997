package main

import (
	"bytes"
	"context"
	"log/slog"
	"log/syslog"
	"sync"
)

// syslogHandler sends each record to the local syslog daemon (/dev/log),
// where passt logs once in the background: the text form of the record,
// at the record's severity, facility daemon.
type syslogHandler struct {
	h   slog.Handler // a text handler writing into out.buf
	out *syslogOut
}

// syslogOut is shared by a handler and everything derived from it: the
// connection and the buffer one record is formatted into.
type syslogOut struct {
	mu  sync.Mutex
	buf bytes.Buffer
	w   *syslog.Writer
}

// newSyslogHandler connects to syslog now, while the daemon may still
// open sockets, and returns the handler and its closer.
func newSyslogHandler(tag string, hopts *slog.HandlerOptions) (slog.Handler, func(), error) {
	w, err := syslog.New(syslog.LOG_DAEMON|syslog.LOG_INFO, tag)
	if err != nil {
		return nil, func() {}, err
	}
	out := &syslogOut{w: w}
	// The syslog daemon stamps the time itself.
	text := &slog.HandlerOptions{Level: hopts.Level, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}
	return &syslogHandler{h: slog.NewTextHandler(&out.buf, text), out: out}, func() { w.Close() }, nil
}

func (s *syslogHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return s.h.Enabled(ctx, l)
}

func (s *syslogHandler) Handle(ctx context.Context, r slog.Record) error {
	s.out.mu.Lock()
	defer s.out.mu.Unlock()
	s.out.buf.Reset()
	if err := s.h.Handle(ctx, r); err != nil {
		return err
	}
	msg := s.out.buf.String()
	switch {
	case r.Level >= slog.LevelError:
		return s.out.w.Err(msg)
	case r.Level >= slog.LevelWarn:
		return s.out.w.Warning(msg)
	case r.Level >= slog.LevelInfo:
		return s.out.w.Info(msg)
	}
	return s.out.w.Debug(msg)
}

func (s *syslogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &syslogHandler{h: s.h.WithAttrs(attrs), out: s.out}
}

func (s *syslogHandler) WithGroup(name string) slog.Handler {
	return &syslogHandler{h: s.h.WithGroup(name), out: s.out}
}

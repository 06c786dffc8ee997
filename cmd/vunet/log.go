package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"

	"vunet/cmd/vunet/logfile"
)

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// logOutput is the process logger and what going to the background does
// to it.
type logOutput struct {
	logger *slog.Logger
	close  func()
	// file is the --log-file, for the daemon's standard error after
	// start-up; nil without one.
	file *os.File
	// detach moves a background daemon's logging from standard error to
	// syslog; nil when logging does not change (a log file, -e, or the
	// foreground).
	detach func()
}

// newLogger builds the process logger from the observability flags. In
// the background (daemon) without a log file and without -e, start-up
// logs to standard error, which the launcher's caller reads, and the
// serving daemon to syslog like passt (discarded where there is none).
func newLogger(o *options, stderr io.Writer, daemon bool, tag string) (*logOutput, error) {
	level, err := parseLevel(o.logLevel)
	if err != nil {
		return nil, err
	}
	hopts := &slog.HandlerOptions{Level: level}
	handler := func(w io.Writer) slog.Handler {
		if o.logFormat == "json" {
			return slog.NewJSONHandler(w, hopts)
		}
		return slog.NewTextHandler(w, hopts)
	}
	out := &logOutput{close: func() {}}
	switch {
	case o.logFile != "":
		// The sandbox opens no path after start-up: the size cap cuts
		// old lines inside this open file, never reopening it.
		f, err := logfile.Open(o.logFile, int64(o.logSize), func(removed int64) []byte {
			var b bytes.Buffer
			slog.New(handler(&b)).Warn("log file reached --log-size: older lines removed",
				"removed_bytes", removed, "log_size", o.logSize)
			return b.Bytes()
		})
		if err != nil {
			return nil, fmt.Errorf("open log file: %w", err)
		}
		out.logger, out.close, out.file = slog.New(handler(f)), func() { f.Close() }, f.File()
	case daemon && !o.logStderr:
		after, closeSys, err := newSyslogHandler(tag, hopts)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v: the daemon's log after start-up is discarded; --log-file FILE keeps it\n", tag, err)
			after = slog.NewTextHandler(io.Discard, hopts)
		}
		sw := newSwitchHandler(handler(stderr), after)
		out.logger, out.close, out.detach = slog.New(sw), closeSys, sw.flip
	default:
		out.logger = slog.New(handler(stderr))
	}
	return out, nil
}

// switchHandler logs to before until flip, then to after. Derived
// handlers (With, WithGroup) flip with their parent.
type switchHandler struct {
	before, after slog.Handler
	flipped       *atomic.Bool
}

func newSwitchHandler(before, after slog.Handler) *switchHandler {
	return &switchHandler{before: before, after: after, flipped: new(atomic.Bool)}
}

func (h *switchHandler) flip() { h.flipped.Store(true) }

func (h *switchHandler) current() slog.Handler {
	if h.flipped.Load() {
		return h.after
	}
	return h.before
}

func (h *switchHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.current().Enabled(ctx, l)
}

func (h *switchHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.current().Handle(ctx, r)
}

func (h *switchHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &switchHandler{before: h.before.WithAttrs(attrs), after: h.after.WithAttrs(attrs), flipped: h.flipped}
}

func (h *switchHandler) WithGroup(name string) slog.Handler {
	return &switchHandler{before: h.before.WithGroup(name), after: h.after.WithGroup(name), flipped: h.flipped}
}

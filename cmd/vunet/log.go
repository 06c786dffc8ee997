package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
)

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// newLogger builds the process logger from the observability flags.
func newLogger(o *options, stderr io.Writer) (*slog.Logger, func(), error) {
	level, err := parseLevel(o.logLevel)
	if err != nil {
		return nil, nil, err
	}
	if o.debug || o.trace {
		level = slog.LevelDebug
	}
	if o.quiet {
		level = slog.LevelWarn
	}
	w, closeFn := stderr, func() {}
	if o.logFile != "" {
		f, err := os.OpenFile(o.logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		if err != nil {
			return nil, nil, fmt.Errorf("open log file: %w", err)
		}
		w, closeFn = f, func() { f.Close() }
	}
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, hopts)
	if o.logFormat == "json" {
		h = slog.NewJSONHandler(w, hopts)
	}
	return slog.New(h), closeFn, nil
}

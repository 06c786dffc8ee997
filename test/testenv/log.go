package testenv

import (
	"io"
	"log/slog"
	"os"
)

// Logger is the logger a test hands the code under test: silent, or debug
// lines on stderr when VUNET_TEST_LOG is set.
func Logger() *slog.Logger {
	if os.Getenv("VUNET_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

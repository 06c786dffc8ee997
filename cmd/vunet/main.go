package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without the process exit, so tests can drive it.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "qemu-args", "libvirt-xml":
			return runHelper(args[0], args[1:], stdout, stderr)
		}
	}
	opts, err := parseFlags(args, stdout)
	if errors.Is(err, errHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "vunet: %v\n", err)
		return 1
	}
	if opts.version {
		fmt.Fprintln(stdout, versionLine(buildInfo()))
		return 0
	}
	if opts.printCapabilities {
		// The vhost-user back-end capability document, as QEMU and libvirt
		// expect from --print-capabilities.
		fmt.Fprintln(stdout, `{"type": "net"}`)
		return 0
	}

	logger, closeLog, err := newLogger(opts, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "vunet: %v\n", err)
		return 1
	}
	defer closeLog()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if err := serve(ctx, opts, logger, stdout); err != nil {
		logger.Error("vunet stopped", "err", err)
		fmt.Fprintf(stderr, "vunet: %v\n", err)
		return 1
	}
	return 0
}

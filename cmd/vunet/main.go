package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"vunet/cmd/vunet/isolation"
)

func main() {
	if isolation.KeeperRequested() {
		os.Exit(isolation.RunKeeper())
	}
	os.Exit(runProgram(programOf(os.Args[0]), os.Args[1:], os.Stdout, os.Stderr))
}

// run is main for tests: the binary invoked as vunet, without its exit.
func run(args []string, stdout, stderr io.Writer) int {
	return runProgram(program{name: "vunet"}, args, stdout, stderr)
}

// runProgram is main without the process exit.
func runProgram(p program, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "qemu-args", "libvirt-xml":
			return runHelper(args[0], args[1:], stdout, stderr)
		case "man", "completion":
			return runDocs(args[0], args[1:], stdout, stderr)
		case "ctl":
			return runCtl(args[1:], stdout, stderr)
		}
	}
	readyPipe, err := takeReadyPipe()
	if err != nil {
		fmt.Fprintf(stderr, "vunet: %v\n", err)
		return 1
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
	if err := opts.resolveTransport(p); err != nil {
		fmt.Fprintf(stderr, "vunet: %v\n", err)
		return 1
	}
	if readyPipe == nil && startsInBackground(p, opts, os.Getenv) {
		return launchBackground(p, args, opts, stdout, stderr)
	}

	// Before anything is opened: what this process inherited and was not
	// given. The readiness pipe is close-on-exec by now, so it stays.
	var closedFDs []int
	if opts.sandbox == "on" {
		closedFDs = isolation.CloseInheritedFDs(opts.givenFDs()...)
	}
	logs, err := newLogger(opts, stderr, readyPipe != nil, p.name)
	if err != nil {
		fmt.Fprintf(stderr, "vunet: %v\n", err)
		return 1
	}
	defer logs.close()
	st := &startup{pipe: readyPipe, stderrTo: logs.file, keepStderr: opts.logStderr,
		detachLog: logs.detach, notify: os.Getenv(notifySocketEnv), closedFDs: closedFDs}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if err := serve(ctx, opts, logs.logger, stdout, st); err != nil {
		logs.logger.Error("vunet stopped", "err", err)
		fmt.Fprintf(stderr, "vunet: %v\n", err)
		return 1
	}
	return 0
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	keep := flag.Bool("keep", false, "keep the work directory (logs, guest console) after a successful run")
	verbose := flag.Bool("v", false, "also print vunet's own log lines")
	timeout := flag.Duration("timeout", 90*time.Second, "give up on the demo proper (vunet start to clean-up) after this long")
	buildTimeout := flag.Duration("build-timeout", 5*time.Minute, "give up on building vunet and the guest image after this long")
	flag.Parse()

	// Ctrl-C cancels the run, which then stops QEMU and vunet before exiting.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, Config{Out: os.Stdout, Verbose: *verbose, Keep: *keep, Timeout: *timeout, BuildTimeout: *buildTimeout})
	if err != nil {
		var missing *MissingError
		if errors.As(err, &missing) {
			fmt.Fprintf(os.Stderr, "make demo: %v\n", err)
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "make demo: FAILED (see above)")
		os.Exit(1)
	}
	fmt.Printf("\ndemo OK in %v (building %v, running %v): the guest got its address from vunet by DHCP and fetched a page from this host's loopback through it.\n",
		rep.Took.Round(100*time.Millisecond), rep.BuildTook.Round(100*time.Millisecond), rep.RunTook.Round(100*time.Millisecond))
}

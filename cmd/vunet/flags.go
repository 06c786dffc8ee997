package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// errHelp reports that -h/--help was handled and the process should exit 0.
var errHelp = errors.New("help requested")

// options is the parsed command line.
type options struct {
	socket     string
	socketMode os.FileMode
	connect    string
	fd         int
	oneOff     bool
	queues     int

	metrics string

	logLevel  string
	logFormat string
	logFile   string
	debug     bool
	quiet     bool

	printQEMUArgs     bool
	printCapabilities bool
	version           bool
}

// flagGroup keeps --help grouped by topic; each entry lists every spelling
// of one option (passt's short letters included) so users of either find it.
type flagGroup struct {
	title string
	names [][]string
}

var flagGroups = []flagGroup{
	{"Socket", [][]string{{"socket", "s"}, {"socket-mode"}, {"connect"}, {"fd", "F"}, {"one-off", "1"}, {"vhost-user"}, {"queues"}}},
	{"Observability", [][]string{{"metrics"}, {"debug", "d"}, {"quiet", "q"}, {"log-level"}, {"log-format"}, {"log-file", "l"}}},
	{"Information", [][]string{{"print-capabilities"}, {"print-qemu-args"}, {"version"}}},
}

// fileMode parses an octal permission such as 0660.
type fileMode struct{ m *os.FileMode }

func (f fileMode) String() string {
	if f.m == nil {
		return ""
	}
	return fmt.Sprintf("%#o", uint32(*f.m))
}

func (f fileMode) Set(s string) error {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o777 {
		return fmt.Errorf("want an octal mode such as 0660, got %q", s)
	}
	*f.m = os.FileMode(v)
	return nil
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{socketMode: 0o600, fd: -1, queues: 1, logLevel: "info", logFormat: "text"}
	fs := flag.NewFlagSet("vunet", flag.ContinueOnError)
	fs.SetOutput(io.Discard)

	str := func(p *string, help string, names ...string) {
		for _, n := range names {
			fs.StringVar(p, n, *p, help)
		}
	}
	boolean := func(p *bool, help string, names ...string) {
		for _, n := range names {
			fs.BoolVar(p, n, *p, help)
		}
	}
	integer := func(p *int, help string, names ...string) {
		for _, n := range names {
			fs.IntVar(p, n, *p, help)
		}
	}

	str(&o.socket, "listen for the front-end on this UNIX socket `PATH` (server mode)", "socket", "s")
	fs.Var(fileMode{&o.socketMode}, "socket-mode", "permissions of the listening socket `MODE` (octal; 0660 lets a group such as libvirt-qemu connect)")
	str(&o.connect, "connect to a front-end listening on `PATH` (QEMU server=on) and reconnect when it goes away", "connect")
	integer(&o.fd, "serve an already-connected vhost-user socket `FD`", "fd", "F")
	boolean(&o.oneOff, "exit when the first front-end disconnects", "one-off", "1")
	var vhostUser bool
	boolean(&vhostUser, "accepted for passt compatibility: vunet always speaks vhost-user", "vhost-user")
	integer(&o.queues, "queue pairs offered to the front-end `N`", "queues")

	str(&o.metrics, "serve Prometheus metrics on `ADDR` (host:port) at /metrics; off by default", "metrics")
	boolean(&o.debug, "debug logging", "debug", "d")
	boolean(&o.quiet, "log warnings and errors only", "quiet", "q")
	str(&o.logLevel, "log `LEVEL`: debug, info, warn, error", "log-level")
	str(&o.logFormat, "log `FORMAT`: text or json", "log-format")
	str(&o.logFile, "write logs to `FILE` instead of standard error", "log-file", "l")

	boolean(&o.printCapabilities, "print the vhost-user back-end capabilities as JSON and exit", "print-capabilities")
	boolean(&o.printQEMUArgs, "print the QEMU arguments that connect to this back-end at start-up", "print-qemu-args")
	boolean(&o.version, "print the version and exit", "version")

	fs.Usage = func() { printUsage(stderr, fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, errHelp
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return o, o.validate()
}

func (o *options) validate() error {
	if o.version || o.printCapabilities {
		return nil
	}
	modes := 0
	for _, set := range []bool{o.socket != "", o.connect != "", o.fd >= 0} {
		if set {
			modes++
		}
	}
	switch {
	case modes == 0:
		return errors.New("one of --socket PATH, --connect PATH or --fd FD is required")
	case modes > 1:
		return errors.New("--socket, --connect and --fd exclude each other")
	}
	if o.queues < 1 || o.queues > 128 {
		return fmt.Errorf("--queues %d: want 1..128", o.queues)
	}
	if o.debug && o.quiet {
		return errors.New("--debug and --quiet exclude each other")
	}
	switch o.logFormat {
	case "text", "json":
	default:
		return fmt.Errorf("--log-format %q: want text or json", o.logFormat)
	}
	if _, err := parseLevel(o.logLevel); err != nil {
		return err
	}
	return nil
}

func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "Usage: vunet --socket PATH [options]")
	fmt.Fprintln(w, "       vunet --connect PATH [options]")
	for _, g := range flagGroups {
		fmt.Fprintf(w, "\n%s:\n", g.title)
		for _, names := range g.names {
			f := fs.Lookup(names[0])
			if f == nil {
				continue
			}
			arg, help := flag.UnquoteUsage(f)
			spell := make([]string, len(names))
			for i, n := range names {
				if len(n) == 1 {
					spell[i] = "-" + n
				} else {
					spell[i] = "--" + n
				}
			}
			line := strings.Join(spell, ", ")
			if arg != "" && arg != "value" {
				line += " " + arg
			}
			fmt.Fprintf(w, "  %-32s %s\n", line, help)
		}
	}
}

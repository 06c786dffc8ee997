package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"vunet/cmd/vunet/control"
)

// vunet ctl: the control endpoint's client (package control). Its options
// and commands are declared here once, for its --help, the manual page and
// the shell completions.

// ctlCommands are vunet ctl's commands.
var ctlCommands = []struct{ name, args, does string }{
	{"list", "", "list the forwarded ports open, with their IDs"},
	{"add", "-t SPEC | -u SPEC ...", "forward host ports to the guest, passt's -t/-u syntax with explicit ports: 22, 8000-8010, 2222:22, ADDR/22, %IF/22"},
	{"remove", "-t SPEC | -u SPEC | ID ...", "close forwarded host ports, named by host port (and the bind address or interface they were given) or by ID"},
	{"status", "", "the guest's addresses, its flows by protocol, the queue pairs, the forwards"},
}

// ctlOptions are vunet ctl's options.
type ctlOptions struct {
	control string
	json    bool
}

// addCtlFlags defines vunet ctl's own options on fs and returns their names
// in --help order.
func addCtlFlags(fs *flag.FlagSet, o *ctlOptions) []string {
	fs.StringVar(&o.control, "control", "", "the daemon's control socket `PATH` (its --control)")
	fs.BoolVar(&o.json, "json", false, "print the endpoint's JSON answer instead of text")
	return []string{"control", "json"}
}

// ctlFlagDocs lists vunet ctl's options for the manual page and completions.
func ctlFlagDocs() []flagDoc {
	fs := flag.NewFlagSet("ctl", flag.ContinueOnError)
	var o ctlOptions
	var docs []flagDoc
	for _, n := range addCtlFlags(fs, &o) {
		docs = append(docs, docOf("", []string{n}, fs.Lookup(n)))
	}
	return docs
}

// ctlSpecFlags are the spellings add and remove take a spec with.
var ctlSpecFlags = map[string]string{"-t": "tcp", "--tcp-ports": "tcp", "-u": "udp", "--udp-ports": "udp"}

func writeCtlUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: vunet ctl --control PATH [--json] COMMAND")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range ctlCommands {
		writeUsageEntry(w, strings.TrimSpace(c.name+" "+c.args), c.does)
	}
	fmt.Fprintln(w, "\nOptions:")
	for _, d := range ctlFlagDocs() {
		writeUsageEntry(w, strings.TrimSpace(d.spelled()[0]+" "+d.arg), d.help)
	}
}

// runCtl runs vunet ctl.
func runCtl(args []string, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "vunet ctl: %v\n", oneLine(err))
		return 1
	}
	var o ctlOptions
	fs := flag.NewFlagSet("ctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	addCtlFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			writeCtlUsage(stdout)
			return 0
		}
		return fail(flagError(err))
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return fail(errors.New("a command is required: list, add, remove or status (vunet ctl --help)"))
	}
	if o.control == "" {
		return fail(errors.New("--control PATH is required: the daemon's --control socket"))
	}
	c := control.NewClient(o.control)
	ctx := context.Background()
	cmd, cargs := rest[0], rest[1:]
	var out any
	var err error
	switch cmd {
	case "list", "status":
		if len(cargs) > 0 {
			return fail(fmt.Errorf("%s takes no arguments", cmd))
		}
		if cmd == "list" {
			out, err = c.Forwards(ctx)
		} else {
			out, err = c.Status(ctx)
		}
	case "add", "remove":
		out, err = ctlChange(ctx, c, cmd, cargs)
	default:
		return fail(fmt.Errorf("unknown command %q: want list, add, remove or status", cmd))
	}
	if err != nil {
		return fail(err)
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return fail(err)
		}
		return 0
	}
	switch v := out.(type) {
	case []control.Forward:
		writeForwards(stdout, v)
	case control.Status:
		writeStatus(stdout, v)
	}
	return 0
}

// ctlChange runs add or remove: each -t/-u SPEC (and, for remove, each
// ID) is one request, in order; the first failure stops, after what was
// done is printed.
func ctlChange(ctx context.Context, c *control.Client, cmd string, args []string) ([]control.Forward, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("%s: give -t SPEC or -u SPEC%s", cmd, map[bool]string{true: ", or forward IDs"}[cmd == "remove"])
	}
	var done []control.Forward
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, inline := strings.Cut(a, "=")
		proto, isSpec := ctlSpecFlags[name]
		var got []control.Forward
		var err error
		switch {
		case isSpec:
			if !inline {
				if i+1 == len(args) {
					return done, fmt.Errorf("%s %s: a SPEC is missing", cmd, a)
				}
				i++
				val = args[i]
			}
			if cmd == "add" {
				got, err = c.Add(ctx, proto, val)
			} else {
				got, err = c.Remove(ctx, proto, val)
			}
		case cmd == "remove":
			id, perr := strconv.ParseUint(a, 10, 64)
			if perr != nil {
				return done, fmt.Errorf("remove %q: want -t SPEC, -u SPEC or a forward ID", a)
			}
			got, err = c.RemoveID(ctx, id)
		default:
			return done, fmt.Errorf("add %q: want -t SPEC or -u SPEC", a)
		}
		done = append(done, got...)
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// writeForwards prints forwards as a table.
func writeForwards(w io.Writer, fws []control.Forward) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROTO\tADDRESS\tHOST PORT\tGUEST PORT\tINTERFACE")
	for _, f := range fws {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\n", f.ID, f.Protocol, f.Address, f.HostPort, f.GuestPort, f.Interface)
	}
	tw.Flush()
}

// writeStatus prints the status, a line a fact.
func writeStatus(w io.Writer, s control.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	line := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, args...)...) }
	g := s.Guest
	line("guest mac", "%s", orNone(g.MAC, "unknown (no frame from the guest yet)"))
	line("guest ipv4", "%s", offered(g.IPv4, g.DHCPLeases, "DHCP"))
	line("guest ipv6", "%s", offered(g.IPv6, g.DHCPv6Leases, "DHCPv6"))
	line("seen in traffic", "%s", orNone(strings.Join(g.Seen, ", "), "none yet"))
	running := 0
	for _, p := range s.Queues.Pairs {
		if p.Running {
			running++
		}
	}
	line("queue pairs", "%d offered, %d running", s.Queues.Offered, running)
	line("flows", "%s", protoCounts(s.Flows, nil))
	line("forwards", "tcp %d, udp %d", s.Forwards["tcp"], s.Forwards["udp"])
	for _, p := range s.Queues.Pairs {
		state := "stopped"
		if p.Running {
			state = "running"
		}
		line(fmt.Sprintf("pair %d", p.Index), "%s; flows %s", state, protoCounts(p.Flows, p.Capacity))
	}
	tw.Flush()
}

func orNone(s, none string) string {
	if s == "" {
		return none
	}
	return s
}

func offered(addr string, leases uint64, svc string) string {
	if addr == "" {
		return "none offered"
	}
	if leases == 0 {
		return addr + " (offered; no " + svc + " lease yet)"
	}
	plural := "s"
	if leases == 1 {
		plural = ""
	}
	return fmt.Sprintf("%s (offered; %d %s lease%s)", addr, leases, svc, plural)
}

// protoCounts spells flows by protocol, with the capacity when given.
func protoCounts(n, capacity map[string]int64) string {
	var out []string
	for _, p := range []string{"tcp", "udp", "icmp"} {
		s := fmt.Sprintf("%s %d", p, n[p])
		if capacity != nil {
			s += fmt.Sprintf("/%d", capacity[p])
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

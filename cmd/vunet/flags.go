package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"vunet/cmd/vunet/portspec"
)

// errHelp reports that -h/--help was handled and the process should exit 0.
var errHelp = errors.New("help requested")

// options is the parsed command line.
type options struct {
	// Socket.
	socket     string
	socketMode os.FileMode
	connect    string
	fd         int
	oneOff     bool
	queues     int
	foreground bool
	pidFile    string
	runAs      string

	// Guest addressing. Unset values (invalid addresses, -1 numbers) keep
	// the host-derived defaults of linksvc.DetectHostDefaults.
	addr4, addr6       addrValue
	prefix4            int // -n; -1 = unset
	gw4, gw6           addrValue
	ourMAC, guestMAC   macValue
	mtu                int // -1 = unset; 0 = passt's "do not assign" (not supported, warned)
	iface              string
	outbound4          addrValue
	outbound6          addrValue
	dns                addrList
	dnsNone            bool
	dnsForward4        addrValue
	dnsForward6        addrValue
	dnsHost4, dnsHost6 addrValue
	search             []string
	searchNone         bool
	only4, only6       bool
	noDHCP, noDHCPv6   bool
	noNDP, noRA        bool
	hostname, fqdn     string

	// Forwarding.
	tcpPorts, udpPorts  portspec.Set
	noTCP, noUDP        bool
	noICMP              bool
	mapHostLoopback     string
	mapHostLoopbackNone bool
	noMapGW             bool

	// Limits.
	maxFlows, maxTCPFlows int
	udpTimeout            time.Duration
	icmpTimeout           time.Duration
	tcpIdleTimeout        time.Duration
	tcpSndBuf, tcpRcvBuf  int

	// Observability.
	metrics   string
	logLevel  string
	logFormat string
	logFile   string
	debug     bool
	trace     bool
	quiet     bool
	pcap      string

	// Information.
	printQEMUArgs     bool
	printCapabilities bool
	version           bool

	// set records every flag given, by canonical (first) name, for
	// conflict checks.
	set map[string]bool
}

// option describes one flag: every spelling (long names first, passt's
// short letter last) and the --help group it is listed under.
type option struct {
	group string
	names []string
}

// groups is the --help order.
var groups = []string{"Socket", "Guest addressing", "Forwarding", "Limits", "Observability", "Information"}

func newOptions() *options {
	return &options{
		socketMode: 0o600, fd: -1, queues: 1, prefix4: -1, mtu: -1,
		logLevel: "info", logFormat: "text", set: map[string]bool{},
	}
}

// flagSet builds the flag set bound to o, and the table that groups it
// for --help.
func (o *options) flagSet() (*flag.FlagSet, []option) {
	fs := flag.NewFlagSet("vunet", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var table []option
	group := ""
	add := func(v flag.Value, help string, names ...string) {
		for _, n := range names {
			fs.Var(v, n, help)
		}
		table = append(table, option{group: group, names: names})
	}
	str := func(p *string, help string, names ...string) { add((*stringValue)(p), help, names...) }
	boolean := func(p *bool, help string, names ...string) { add((*boolValue)(p), help, names...) }
	integer := func(p *int, help string, names ...string) { add((*intValue)(p), help, names...) }
	dur := func(p *time.Duration, help string, names ...string) { add((*durationValue)(p), help, names...) }

	group = "Socket"
	str(&o.socket, "listen for the front-end on the UNIX socket `PATH` (server mode)", "socket", "socket-path", "s")
	add(fileMode{&o.socketMode}, "permissions of the listening socket, octal `MODE` (0660 lets a group such as libvirt-qemu connect; default 0600)", "socket-mode")
	str(&o.connect, "connect to a front-end listening on `PATH` (QEMU server=on) and reconnect when it goes away", "connect")
	integer(&o.fd, "serve the already-connected vhost-user socket `FD` (implies --one-off)", "fd", "F")
	boolean(&o.oneOff, "exit when the first front-end disconnects", "one-off", "1")
	var vhostUser bool
	boolean(&vhostUser, "accepted for passt compatibility: vunet always speaks vhost-user", "vhost-user")
	integer(&o.queues, "queue pairs offered to the front-end, `N` in 1..128 (default 1)", "queues")
	boolean(&o.foreground, "accepted for passt compatibility: vunet always stays in the foreground", "foreground", "f")
	str(&o.pidFile, "write the process ID to `FILE` at start-up; removed at exit", "pid", "P")
	str(&o.runAs, "switch to `USER[:GROUP]` (name or number) before serving", "runas")

	group = "Guest addressing"
	add(familyAddr{&o.addr4, &o.addr6, "address", addrUsable}, "guest `ADDR`ess (IPv4 via DHCP, IPv6 via DHCPv6/RA prefix); once per family (default: the host's)", "address", "a")
	add(netmaskValue{&o.prefix4}, "guest IPv4 netmask, dotted or prefix length `MASK`", "netmask", "n")
	add(familyAddr{&o.gw4, &o.gw6, "gateway", addrUsable}, "gateway `ADDR` announced to the guest; once per family (default: the host's)", "gateway", "g")
	add(&o.ourMAC, "our MAC `ADDR`ess as the guest sees it (default 9a:55:9a:55:9a:55)", "mac-addr", "M")
	add(&o.guestMAC, "the guest's MAC `ADDR`ess, when known in advance", "guest-mac")
	integer(&o.mtu, "guest `MTU` announced by DHCP and RA, 68..65535 (default 65520)", "mtu", "m")
	str(&o.iface, "derive guest addresses from host interface `NAME` instead of the default-route one", "interface", "i")
	add(familyAddr{&o.outbound4, &o.outbound6, "outbound", addrUsable}, "source `ADDR` of outbound host sockets; once per family", "outbound", "o")
	add(dnsValue{o}, "resolver `ADDR` for the guest, repeatable; \"none\" for no resolvers (default: the host's, loopback ones via the gateway)", "dns", "D")
	add(familyAddr{&o.dnsForward4, &o.dnsForward6, "dns-forward", addrAny}, "guest DNS traffic to `ADDR` (must be the gateway) goes to the host resolver (--dns-host)", "dns-forward")
	add(familyAddr{&o.dnsHost4, &o.dnsHost6, "dns-host", addrAny}, "host resolver `ADDR` for --dns-forward (default: the first in /etc/resolv.conf)", "dns-host")
	add(searchValue{o}, "DNS search `DOMAINS`, space-separated, repeatable; \"none\" for no list (default: /etc/resolv.conf)", "search", "S")
	boolean(&o.only4, "IPv4 only", "ipv4-only", "4")
	boolean(&o.only6, "IPv6 only", "ipv6-only", "6")
	boolean(&o.noDHCP, "no DHCP server", "no-dhcp")
	boolean(&o.noDHCPv6, "no DHCPv6 server", "no-dhcpv6")
	boolean(&o.noNDP, "no NDP answers (neighbour and router advertisements)", "no-ndp")
	boolean(&o.noRA, "no router advertisements", "no-ra")
	str(&o.hostname, "guest host `NAME` for DHCP (option 12)", "hostname", "H")
	str(&o.fqdn, "guest fully qualified domain `NAME` for DHCP (option 81) and DHCPv6 (option 39)", "fqdn")

	group = "Forwarding"
	add(portsValue{&o.tcpPorts}, "forward host TCP ports to the guest, passt `SPEC`: all, none, auto, 22,80, 8000-8010, 2222:22, ADDR/22, %IF/22, ~EXCL; repeatable", "tcp-ports", "t")
	add(portsValue{&o.udpPorts}, "forward host UDP ports to the guest, `SPEC` as for --tcp-ports; replies leave from the forwarded port", "udp-ports", "u")
	boolean(&o.noTCP, "drop guest TCP", "no-tcp")
	boolean(&o.noUDP, "drop guest UDP (DHCP and DHCPv6 still answer)", "no-udp")
	boolean(&o.noICMP, "drop guest ICMP echo", "no-icmp")
	str(&o.mapHostLoopback, "guest `ADDR` that reaches the host's loopback: the gateway (default) or none", "map-host-loopback")
	boolean(&o.noMapGW, "do not map the gateway address to the host's loopback", "no-map-gw")

	group = "Limits"
	integer(&o.maxFlows, "UDP and ICMP flows per queue pair `N` (default 1024)", "max-flows")
	integer(&o.maxTCPFlows, "TCP connections per queue pair `N` (default 4096)", "max-tcp-flows")
	dur(&o.udpTimeout, "close idle UDP flows after `DURATION` (default 3m)", "udp-timeout")
	dur(&o.icmpTimeout, "close idle ICMP echo flows after `DURATION` (default 1m)", "icmp-timeout")
	dur(&o.tcpIdleTimeout, "reset TCP connections idle for `DURATION` (default 2h)", "tcp-idle-timeout")
	integer(&o.tcpSndBuf, "pin SO_SNDBUF of host TCP sockets to `BYTES` (default: kernel auto-tuning)", "tcp-sndbuf")
	integer(&o.tcpRcvBuf, "pin SO_RCVBUF of host TCP sockets to `BYTES` (default: kernel auto-tuning)", "tcp-rcvbuf")

	group = "Observability"
	str(&o.metrics, "serve Prometheus metrics on `ADDR` (host:port) at /metrics; off by default", "metrics")
	boolean(&o.debug, "debug logging", "debug", "d")
	boolean(&o.trace, "accepted for passt compatibility: same as --debug", "trace")
	boolean(&o.quiet, "log warnings and errors only", "quiet", "q")
	str(&o.logLevel, "log `LEVEL`: debug, info, warn, error (default info)", "log-level")
	str(&o.logFormat, "log `FORMAT`: text or json (default text)", "log-format")
	str(&o.logFile, "append logs to `FILE` instead of standard error", "log-file", "l")
	str(&o.pcap, "capture guest-side frames, both directions, to pcap `FILE`", "pcap", "p")

	group = "Information"
	boolean(&o.printCapabilities, "print the vhost-user back-end capabilities as JSON and exit", "print-capabilities")
	boolean(&o.printQEMUArgs, "print the QEMU arguments that connect to this back-end at start-up", "print-qemu-args")
	boolean(&o.version, "print the version and exit", "version")
	return fs, table
}

// canonical maps every spelling to the option's first name, so conflicts
// are reported under one name however the user spelled them.
func canonical(table []option) map[string]string {
	m := map[string]string{}
	for _, op := range table {
		for _, n := range op.names {
			m[n] = op.names[0]
		}
	}
	return m
}

// parseFlags parses args. Errors are one line naming the flag.
func parseFlags(args []string, stdout io.Writer) (*options, error) {
	o, err := parseFlagsRaw(args, stdout)
	if err != nil && err != errHelp {
		return nil, oneLine(err)
	}
	return o, err
}

// oneLine escapes control characters that user input brought into an
// error message, so it stays one line on a terminal or in a log.
func oneLine(err error) error {
	msg := err.Error()
	if !strings.ContainsFunc(msg, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return err
	}
	q := strconv.Quote(msg)
	return errors.New(q[1 : len(q)-1])
}

func parseFlagsRaw(args []string, stdout io.Writer) (*options, error) {
	o := newOptions()
	fs, table := o.flagSet()
	// The flag package prints usage on every error; errors here are one
	// line, and the full help goes to standard output only when asked for.
	fs.Usage = func() {}
	if err := fs.Parse(expandShort(args, fs)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, table)
			return nil, errHelp
		}
		return nil, flagError(err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	canon := canonical(table)
	fs.Visit(func(f *flag.Flag) { o.set[canon[f.Name]] = true })
	return o, o.validate()
}

// isBool reports whether a flag takes no value.
func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// expandShort accepts getopt's short-option forms, which passt users
// write and Go's flag package does not parse: clustered switches ("-1fd")
// and a value attached to its letter ("-t22", "-s/tmp/s", "-1dt22").
// Anything else passes through unchanged.
func expandShort(args []string, fs *flag.FlagSet) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) < 2 || a[0] != '-' || a[1] == '-' {
			out = append(out, a)
			continue
		}
		name, _, hasEq := strings.Cut(a[1:], "=")
		if f := fs.Lookup(name); f != nil || hasEq || len(a) == 2 {
			// A complete flag: let the flag package parse it, and keep
			// its separate value, which may itself start with '-'.
			out = append(out, a)
			if f != nil && !hasEq && !isBool(f) && i+1 < len(args) {
				i++
				out = append(out, args[i])
			}
			continue
		}
		var expanded []string
		ok := true
		for j := 1; j < len(a); j++ {
			f := fs.Lookup(a[j : j+1])
			if f == nil || !isShort(a[j]) {
				ok = false
				break
			}
			if isBool(f) {
				expanded = append(expanded, "-"+a[j:j+1])
				continue
			}
			expanded = append(expanded, "-"+a[j:j+1], a[j+1:])
			if j+1 == len(a) {
				// "-1s PATH": the value is the next argument.
				expanded = expanded[:len(expanded)-1]
				if i+1 < len(args) {
					i++
					expanded = append(expanded, args[i])
				}
			}
			break
		}
		if !ok {
			out = append(out, a) // the flag package reports it as unknown
			continue
		}
		out = append(out, expanded...)
	}
	return out
}

// isShort reports whether c can be one of passt's short option letters.
func isShort(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// flagError rewrites the flag package's messages into one line that names
// the flag the way the user is most likely to have typed it.
func flagError(err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return fmt.Errorf("unknown flag %s", dashed(name))
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return fmt.Errorf("flag %s needs an argument", dashed(name))
	}
	// "invalid value "x" for flag -name: reason"
	if rest, ok := strings.CutPrefix(msg, "invalid value "); ok {
		if i := strings.Index(rest, " for flag -"); i >= 0 {
			tail := rest[i+len(" for flag -"):]
			name, reason, _ := strings.Cut(tail, ": ")
			return fmt.Errorf("%s %s: %s", dashed(name), rest[:i], reason)
		}
	}
	// "invalid boolean value "x" for -name: reason"
	if rest, ok := strings.CutPrefix(msg, "invalid boolean value "); ok {
		if i := strings.Index(rest, " for -"); i >= 0 {
			name, reason, _ := strings.Cut(rest[i+len(" for -"):], ": ")
			return fmt.Errorf("%s %s: %s", dashed(name), rest[:i], reason)
		}
	}
	return err
}

// dashed spells a flag name as on the command line: -x for passt's short
// letters, --name for the rest.
func dashed(name string) string {
	d := "--" + name
	if len(name) == 1 {
		d = "-" + name
	}
	if q := strconv.Quote(d); q[1:len(q)-1] != d {
		return q // control characters: keep the message on one line
	}
	return d
}

// validate rejects contradictory or out-of-range options. Whether an
// address fits the host (gateway on-link, mapped address is the gateway)
// is checked later, with the detected defaults at hand.
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
	if o.set["fd"] && o.fd < 0 {
		return fmt.Errorf("--fd %d: not a file descriptor", o.fd)
	}
	if o.fd >= 0 {
		o.oneOff = true // passt: --fd implies --one-off
	}
	if o.oneOff && o.connect != "" {
		return errors.New("--one-off and --connect exclude each other (the client reconnects)")
	}
	if o.queues < 1 || o.queues > 128 {
		return fmt.Errorf("--queues %d: want 1..128", o.queues)
	}
	if o.debug && o.quiet || o.trace && o.quiet {
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
	if o.set["log-level"] && (o.debug || o.quiet) {
		return errors.New("--log-level excludes --debug and --quiet")
	}

	if o.only4 && o.only6 {
		return errors.New("--ipv4-only (-4) and --ipv6-only (-6) exclude each other")
	}
	if o.only4 {
		for name, a := range map[string]addrValue{"--address": o.addr6, "--gateway": o.gw6, "--outbound": o.outbound6, "--dns-forward": o.dnsForward6} {
			if a.IsValid() {
				return fmt.Errorf("%s %v: IPv6 address with --ipv4-only", name, a)
			}
		}
	}
	if o.only6 {
		for name, a := range map[string]addrValue{"--address": o.addr4, "--gateway": o.gw4, "--outbound": o.outbound4, "--dns-forward": o.dnsForward4} {
			if a.IsValid() {
				return fmt.Errorf("%s %v: IPv4 address with --ipv6-only", name, a)
			}
		}
		if o.prefix4 >= 0 {
			return errors.New("--netmask with --ipv6-only")
		}
	}
	if o.mtu != -1 && o.mtu != 0 && (o.mtu < 68 || o.mtu > 65535) {
		return fmt.Errorf("--mtu %d: want 68..65535 (or 0)", o.mtu)
	}
	if o.dnsNone && len(o.dns) > 0 {
		return errors.New("--dns none excludes --dns ADDR")
	}
	if o.searchNone && len(o.search) > 0 {
		return errors.New("--search none excludes --search DOMAIN")
	}
	if o.noTCP && o.tcpPorts.Enabled() {
		return errors.New("--tcp-ports: TCP port forwarding requested but --no-tcp disables TCP")
	}
	if o.noUDP && o.udpPorts.Enabled() {
		return errors.New("--udp-ports: UDP port forwarding requested but --no-udp disables UDP")
	}
	switch o.mapHostLoopback {
	case "":
	case "none":
		o.mapHostLoopbackNone = true
	default:
		if _, err := parseAddr(o.mapHostLoopback); err != nil {
			return fmt.Errorf("--map-host-loopback %q: want an address or none", o.mapHostLoopback)
		}
		if o.noMapGW {
			return errors.New("--map-host-loopback ADDR and --no-map-gw exclude each other")
		}
	}
	for name, v := range map[string]int{"--max-flows": o.maxFlows, "--max-tcp-flows": o.maxTCPFlows, "--tcp-sndbuf": o.tcpSndBuf, "--tcp-rcvbuf": o.tcpRcvBuf} {
		if v < 0 {
			return fmt.Errorf("%s %d: must not be negative", name, v)
		}
	}
	for name, v := range map[string]time.Duration{"--udp-timeout": o.udpTimeout, "--icmp-timeout": o.icmpTimeout, "--tcp-idle-timeout": o.tcpIdleTimeout} {
		if v < 0 {
			return fmt.Errorf("%s %v: must not be negative", name, v)
		}
	}
	if o.iface != "" && (len(o.iface) > 15 || strings.ContainsAny(o.iface, "/ \t\n")) {
		return fmt.Errorf("--interface %q: not an interface name", o.iface)
	}
	if o.pidFile != "" && o.pidFile == o.socket {
		return errors.New("--pid and --socket name the same file")
	}
	return nil
}

func printUsage(w io.Writer, fs *flag.FlagSet, table []option) {
	fmt.Fprintln(w, "Usage: vunet --socket PATH [options]      serve a front-end that connects to PATH")
	fmt.Fprintln(w, "       vunet --connect PATH [options]     connect to a front-end listening on PATH")
	fmt.Fprintln(w, "       vunet --fd FD [options]            serve an inherited, connected socket")
	fmt.Fprintln(w, "       vunet qemu-args [options]          print QEMU arguments for the socket")
	fmt.Fprintln(w, "       vunet libvirt-xml [options]        print libvirt XML for the socket")
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n", g)
		for _, op := range table {
			if op.group != g {
				continue
			}
			f := fs.Lookup(op.names[0])
			arg, help := flag.UnquoteUsage(f)
			spell := make([]string, len(op.names))
			for i, n := range op.names {
				spell[i] = dashed(n)
			}
			line := strings.Join(spell, ", ")
			if arg != "" && arg != "value" {
				line += " " + arg
			}
			if len(line) > 30 {
				fmt.Fprintf(w, "  %s\n  %-30s %s\n", line, "", help)
				continue
			}
			fmt.Fprintf(w, "  %-30s %s\n", line, help)
		}
	}
}

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

	"vunet/cmd/vunet/logfile"
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
	vhostUser  bool   // --vhost-user given: passt's start-up semantics apply
	transport  string // "vhost-user" or "stream"; "" until resolveTransport
	pidFile    string
	runAs      string
	sandbox    string // on (default) or off

	// Guest addressing. Unset values (invalid addresses, -1 numbers) keep
	// the host-derived defaults of linksvc.DetectHostDefaults.
	addr4, addr6       addrValue
	prefix4            int  // -n or -a ADDR/LEN; -1 = unset
	prefix6            int  // -a ADDR6/LEN; -1 = unset
	addr4Prefix        bool // the IPv4 prefix came with -a
	netmaskGiven       bool // -n was given
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
	noDHCPDNS          bool
	noDHCPSearch       bool
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
	noSplice            bool

	// Control endpoint.
	control     string
	controlMode os.FileMode

	// Limits.
	maxFlows, maxTCPFlows int
	udpTimeout            time.Duration
	icmpTimeout           time.Duration
	tcpIdleTimeout        time.Duration
	tcpSndBuf, tcpRcvBuf  int
	maxGuestMemory        sizeValue

	// Observability.
	metrics   string
	logLevel  string
	logFormat string
	logFile   string
	logSize   int
	logStderr bool // -e: a background daemon keeps logging to standard error
	trace     bool // --trace was the last level option (same level as --debug)
	pcap      string

	// Live migration.
	migrateTo, migrateFrom string
	repairPath             string

	// Information.
	printQEMUArgs     bool
	printCapabilities bool
	version           bool

	// warnings name the options accepted but not honoured, one line each,
	// logged at start-up.
	warnings []string
}

// option describes one flag: every spelling (long names first, passt's
// short letter last) and the --help group it is listed under.
type option struct {
	group string
	names []string
}

// groups is the --help order.
var groups = []string{"Socket", "Guest addressing", "Forwarding", "Control", "Limits", "Live migration", "Observability", "Information", passtOnlyGroup}

// passtOnlyGroup lists passt options accepted with a start-up warning.
const passtOnlyGroup = "Accepted for passt compatibility, not supported (a start-up warning names each)"

func newOptions() *options {
	return &options{
		socketMode: 0o600, controlMode: 0o600, fd: -1, queues: 1, prefix4: -1, prefix6: -1, mtu: -1,
		logLevel: "info", logFormat: "text",
		sandbox: "on", logSize: logfile.DefaultMax,
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
	add(endpointValue{o, endpointSocket}, "listen for the front-end on the UNIX socket `PATH` (server mode)", "socket", "socket-path", "s")
	add(fileMode{&o.socketMode}, "permissions of the listening socket, octal `MODE` (0660 lets a group such as libvirt-qemu connect; default 0600)", "socket-mode")
	add(endpointValue{o, endpointConnect}, "connect to a front-end listening on `PATH` (QEMU server=on) and reconnect when it goes away", "connect")
	add(endpointValue{o, endpointFD}, "serve the already-connected vhost-user socket `FD` (implies --one-off)", "fd", "F")
	boolean(&o.oneOff, "exit when the first front-end disconnects", "one-off", "1")
	add(vhostUserFlag{o}, "passt's vhost-user mode (--transport vhost-user); without -f, start in the background as passt does", "vhost-user")
	add(transportValue{o}, "what the front-end speaks on the socket, `MODE`: vhost-user, or stream (QEMU's -netdev stream: frames with a 32-bit length, as passt without --vhost-user); default vhost-user, stream when invoked as passt without --vhost-user", "transport")
	integer(&o.queues, "queue pairs offered to the front-end, `N` in 1..128 (default 1)", "queues")
	boolean(&o.foreground, "stay in the foreground (vunet's default unless started as passt or with --vhost-user)", "foreground", "f")
	str(&o.pidFile, "write the serving process's ID to `FILE` once started; removed at exit", "pid", "P")
	str(&o.runAs, "after start-up run as `USER[:GROUP]` (name or number; default when started as root: nobody)", "runas")
	str(&o.sandbox, "`on` (default): after start-up run as --runas with no capabilities, no new files, a system-call allow-list; off: a debugging aid only", "sandbox")

	group = "Guest addressing"
	add(guestAddr{o}, "guest `ADDR`ess[/PREFIXLEN] (IPv4 via DHCP, IPv6 via DHCPv6/RA prefix); one per family, the last wins (default: the host's)", "address", "a")
	add(netmaskValue{o}, "guest IPv4 netmask, dotted or prefix length `MASK`", "netmask", "n")
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
	add(familyOnly{o, false}, "IPv4 only (the later of -4 and -6 wins)", "ipv4-only", "4")
	add(familyOnly{o, true}, "IPv6 only (the later of -4 and -6 wins)", "ipv6-only", "6")
	boolean(&o.noDHCPDNS, "no resolvers in DHCP, DHCPv6 and router advertisements", "no-dhcp-dns")
	boolean(&o.noDHCPSearch, "no search list in DHCP, DHCPv6 and router advertisements", "no-dhcp-search")
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
	boolean(&o.noSplice, "accepted for passt compatibility: passt's vhost-user mode never splices either", "no-splice")

	group = "Control"
	str(&o.control, "serve the control endpoint on the UNIX socket `PATH` (off by default): forwards added and removed while running, status (vunet ctl)", "control")
	add(fileMode{&o.controlMode}, "permissions of the control socket, octal `MODE` (default 0600: only its owner, the user who started vunet or --runas, may connect)", "control-mode")

	group = "Limits"
	integer(&o.maxFlows, "UDP and ICMP flows per queue pair `N` (default 1024)", "max-flows")
	integer(&o.maxTCPFlows, "TCP connections per queue pair `N` (default 4096)", "max-tcp-flows")
	dur(&o.udpTimeout, "close idle UDP flows after `DURATION` (default 3m)", "udp-timeout")
	dur(&o.icmpTimeout, "close idle ICMP echo flows after `DURATION` (default 1m)", "icmp-timeout")
	dur(&o.tcpIdleTimeout, "reset TCP connections idle for `DURATION` (default 2h)", "tcp-idle-timeout")
	integer(&o.tcpSndBuf, "pin SO_SNDBUF of host TCP sockets to `BYTES` (default: kernel auto-tuning)", "tcp-sndbuf")
	integer(&o.tcpRcvBuf, "pin SO_RCVBUF of host TCP sockets to `BYTES` (default: kernel auto-tuning)", "tcp-rcvbuf")
	add(&o.maxGuestMemory, "refuse guest memory tables larger than `SIZE` in total, e.g. 512G, 2T (default 1T)", "max-guest-memory")

	group = "Live migration"
	str(&o.migrateTo, "source of a live migration on this host: accept the destination vunet on the UNIX socket `PATH`; when QEMU migrates the guest its open connections and flows go there", "migrate-to")
	str(&o.migrateFrom, "destination of a live migration on this host: connect at start-up to the source vunet's --migrate-to socket `PATH` and take over the guest's connections and flows when the guest arrives", "migrate-from")
	str(&o.repairPath, "listen on `PATH` for the TCP_REPAIR helper (vunet-repair or passt-repair), which lets TCP connections travel in a front-end's device-state migration stream, across hosts", "repair-path")

	group = "Observability"
	str(&o.metrics, "serve Prometheus metrics on `ADDR` (host:port) at /metrics; off by default", "metrics")
	add(levelValue{o: o, level: "debug"}, "debug logging", "debug", "d")
	add(levelValue{o: o, level: "debug", trace: true}, "passt's extra-verbose level: same as --debug", "trace")
	add(levelValue{o: o, level: "warn"}, "log warnings and errors only", "quiet", "q")
	add(levelValue{o: o}, "log `LEVEL`: debug, info, warn, error (default info; the last of -d, -q, --trace, --log-level wins)", "log-level")
	str(&o.logFormat, "log `FORMAT`: text or json (default text)", "log-format")
	str(&o.logFile, "append logs to `FILE` instead of standard error (or, in the background, syslog)", "log-file", "l")
	integer(&o.logSize, "cap --log-file at `BYTES`, cutting the oldest lines (default 1048576)", "log-size")
	boolean(&o.logStderr, "in the background, keep logging to the launcher's standard error instead of syslog", "stderr", "e")
	str(&o.pcap, "capture guest-side frames, both directions, to pcap `FILE`", "pcap", "p")

	group = "Information"
	boolean(&o.printCapabilities, "print the vhost-user back-end capabilities as JSON and exit", "print-capabilities")
	boolean(&o.printQEMUArgs, "print the QEMU arguments that connect to this back-end at start-up", "print-qemu-args")
	boolean(&o.version, "print the version and exit", "version")

	group = passtOnlyGroup
	for i := range unsupportedOptions {
		u := &unsupportedOptions[i]
		add(unsupportedValue{o, u}, u.helpLine(), u.names...)
	}
	return fs, table
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
	fs, _ := o.flagSet()
	// The flag package prints usage on every error; errors here are one
	// line, and the full help goes to standard output only when asked for.
	fs.Usage = func() {}
	if err := fs.Parse(expandShort(args, fs)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout)
			return nil, errHelp
		}
		return nil, flagError(err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
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
		if pastaOnly[strings.TrimPrefix(name, "-")] {
			return fmt.Errorf("%s is for pasta mode only (vunet implements passt's vhost-user mode)", dashed(strings.TrimPrefix(name, "-")))
		}
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
	if o.oneOff && o.connect != "" {
		return errors.New("--one-off and --connect exclude each other (the client reconnects)")
	}
	if o.queues < 1 || o.queues > 128 {
		return fmt.Errorf("--queues %d: want 1..128", o.queues)
	}
	if o.control != "" && (o.control == o.socket || o.control == o.pidFile || o.control == o.logFile) {
		return fmt.Errorf("--control %s: the path is taken by another option", o.control)
	}
	switch o.logFormat {
	case "text", "json":
	default:
		return fmt.Errorf("--log-format %q: want text or json", o.logFormat)
	}
	// Addresses of a family that -4 or -6 turned off are configured and
	// unused, as in passt: a management stack may pass both.
	if o.mtu != -1 && o.mtu != 0 && (o.mtu < 68 || o.mtu > 65535) {
		return fmt.Errorf("--mtu %d: want 68..65535 (or 0)", o.mtu)
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
		// An address maps even with --no-map-gw, which only drops the
		// default mapping (passt's rule).
		if _, err := parseAddr(o.mapHostLoopback); err != nil {
			return fmt.Errorf("--map-host-loopback %q: want an address or none", o.mapHostLoopback)
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
	switch o.sandbox {
	case "on", "off":
	default:
		return fmt.Errorf("--sandbox %q: want on or off", o.sandbox)
	}
	if o.logSize < logfile.MinMax {
		return fmt.Errorf("--log-size %d: want at least %d bytes", o.logSize, logfile.MinMax)
	}
	if o.pidFile != "" && o.pidFile == o.socket {
		return errors.New("--pid and --socket name the same file")
	}
	return nil
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: vunet --socket PATH [options]      serve a front-end that connects to PATH")
	fmt.Fprintln(w, "       vunet --connect PATH [options]     connect to a front-end listening on PATH")
	fmt.Fprintln(w, "       vunet --fd FD [options]            serve an inherited, connected socket")
	fmt.Fprintln(w, "       vunet qemu-args [options]          print QEMU arguments for the socket")
	fmt.Fprintln(w, "       vunet libvirt-xml [options]        print libvirt XML for the socket")
	fmt.Fprintln(w, "       vunet ctl --control PATH COMMAND   list, add or remove forwards at run time; status")
	fmt.Fprintln(w, "       vunet man | completion bash|zsh    print the manual page or a shell completion")
	group := ""
	for _, d := range daemonFlagDocs() {
		if d.group != group {
			group = d.group
			fmt.Fprintf(w, "\n%s:\n", group)
		}
		left := strings.Join(d.spelled(), ", ")
		if d.arg != "" {
			left += " " + d.arg
		}
		writeUsageEntry(w, left, d.help)
	}
}

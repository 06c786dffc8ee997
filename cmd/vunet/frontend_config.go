package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// helperConfig is what `vunet qemu-args` and `vunet libvirt-xml` describe:
// the front-end side of the configured socket.
type helperConfig struct {
	socket string // vunet listens here (front-end is the client)
	client bool   // vunet --connect: the front-end listens on socket
	stream bool   // --transport stream: QEMU's -netdev stream, not vhost-user
	queues int
	mem    string // guest RAM size, QEMU syntax (1G, 512M)
	tcg    bool   // QEMU 7.2 TCG MSI-X workaround: vectors=0
	mac    string // guest MAC, optional
	id     string // QEMU ids / libvirt alias suffix
	domain string // libvirt-xml: wrap in a minimal <domain> of that name
	qemu   qemuVersion
}

// helperCommands are the helper subcommands, with what each prints.
var helperCommands = []struct{ name, does string }{
	{"qemu-args", "print the QEMU arguments that connect a guest to the socket"},
	{"libvirt-xml", "print the libvirt <interface> and <memoryBacking> elements for the socket"},
}

// addHelperFlags defines a helper subcommand's own flags on fs and returns
// their names in --help order (the manual page and completions list the
// same).
func addHelperFlags(name string, fs *flag.FlagSet, hc *helperConfig, qemuVer *string) []string {
	fs.StringVar(&hc.mem, "mem", hc.mem, "guest RAM `SIZE` (QEMU syntax: 512M, 2G), shared through a memfd backend")
	fs.BoolVar(&hc.tcg, "tcg", false, "add vectors=0, the workaround for QEMU 7.2's TCG crash with MSI-X and vhost-user")
	fs.StringVar(&hc.mac, "guest-mac-addr", "", "guest NIC MAC `ADDR` (default: QEMU's choice)")
	fs.StringVar(&hc.id, "id", hc.id, "QEMU object `ID` prefix / libvirt alias (ua-ID)")
	names := []string{"mem", "tcg", "guest-mac-addr", "id"}
	if name == "libvirt-xml" {
		fs.StringVar(&hc.domain, "domain", "", "print a complete minimal TCG <domain> named `NAME` around the elements")
		return append(names, "domain")
	}
	fs.StringVar(qemuVer, "qemu-version", "", "spell the arguments for QEMU `VERSION` (default: what qemu-system-x86_64 --version says; 7.2 without it)")
	return append(names, "qemu-version")
}

// runHelper runs a helper subcommand. It takes the daemon's own flags, so
// the command line that starts vunet can be reused to print what connects
// to it, plus a few of its own.
func runHelper(name string, args []string, stdout, stderr io.Writer) int {
	o := newOptions()
	fs, table := o.flagSet()
	hc := helperConfig{mem: "1G", id: "vunet0"}
	var qemuVer string
	helperNames := addHelperFlags(name, fs, &hc, &qemuVer)
	fs.Usage = func() {}
	usage := func() {
		fmt.Fprintf(stdout, "Usage: vunet %s --socket PATH [--queues N] [--mem SIZE] [--tcg] [daemon options]\n\n", name)
		fmt.Fprintf(stdout, "Helper options:\n")
		for _, n := range helperNames {
			arg, help := flag.UnquoteUsage(fs.Lookup(n))
			writeUsageEntry(stdout, strings.TrimSpace("--"+n+" "+arg), help)
		}
		fmt.Fprintf(stdout, "\nDaemon options are accepted and ignored except --socket, --connect, --queues,\n--guest-mac and --transport (qemu-args: -netdev stream for --transport stream).\n")
		_ = table
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "vunet %s: %v\n", name, oneLine(err))
		return 1
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
			return 0
		}
		return fail(flagError(err))
	}
	if fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if err := o.resolveTransport(program{name: "vunet"}); err != nil {
		return fail(err)
	}
	hc.stream = o.transport == transportStream
	if hc.stream && name == "libvirt-xml" {
		return fail(errors.New("--transport stream: libvirt starts passt itself for that (<interface type='user'><backend type='passt'/>); its XML names no socket"))
	}
	switch { // the last of --socket and --connect given wins, as for the daemon
	case o.socket != "":
		hc.socket = o.socket
	case o.connect != "":
		hc.socket, hc.client = o.connect, true
	default:
		return fail(errors.New("--socket PATH (or --connect PATH) is required"))
	}
	if o.queues < 1 || o.queues > 128 {
		return fail(fmt.Errorf("--queues %d: want 1..128", o.queues))
	}
	hc.queues = o.queues
	if hc.mac == "" && o.guestMAC.ok {
		hc.mac = o.guestMAC.mac.String()
	}
	if hc.mac != "" {
		var m macValue
		if err := m.Set(hc.mac); err != nil {
			return fail(fmt.Errorf("--guest-mac-addr %q: %w", hc.mac, err))
		}
		hc.mac = m.mac.String()
	}
	if !memSize.MatchString(hc.mem) {
		return fail(fmt.Errorf("--mem %q: want a size such as 512M or 2G", hc.mem))
	}
	if !idRE.MatchString(hc.id) {
		return fail(fmt.Errorf("--id %q: want letters, digits, - and _ (starting with a letter)", hc.id))
	}
	if strings.ContainsAny(hc.socket, "\x00\n") {
		return fail(fmt.Errorf("socket path %q: control characters", hc.socket))
	}
	switch name {
	case "qemu-args":
		if qemuVer != "" {
			v, err := parseVersionArg(qemuVer)
			if err != nil {
				return fail(fmt.Errorf("--qemu-version %q: %w", qemuVer, err))
			}
			hc.qemu = v
		} else {
			v, err := detectQEMUVersion()
			if err != nil {
				v = fallbackQEMU
				fmt.Fprintf(stderr, "# %s: assuming QEMU %v (reconnect=); --qemu-version chooses\n", oneLine(err), v)
			}
			hc.qemu = v
		}
		args := qemuArgs(hc)
		for i := 0; i < len(args); i += 2 {
			sep := " \\"
			if i+2 >= len(args) {
				sep = ""
			}
			fmt.Fprintf(stdout, "%s %s%s\n", args[i], shellQuote(args[i+1]), sep)
		}
		if !hc.tcg && !hc.stream {
			fmt.Fprintln(stderr, "# under TCG with QEMU 7.2, add vectors=0 to the -device (vunet qemu-args --tcg): MSI-X with vhost-user crashes it")
		}
	case "libvirt-xml":
		fmt.Fprint(stdout, libvirtXML(hc))
	}
	return 0
}

var (
	memSize = regexp.MustCompile(`^[1-9][0-9]*[KMGT]?$`)
	idRE    = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,30}$`)
)

// qemuArgs returns QEMU's arguments as flag/value pairs, spelled for QEMU
// hc.qemu (the zero version: the oldest spelling). The guest RAM must
// be shared (memfd, share=on) or QEMU sends the back-end no memory regions
// at all (FIELD-NOTES). With several queue pairs, MSI-X needs 2N+2 vectors;
// under TCG vectors=0 (legacy INTx) avoids QEMU 7.2's crash instead.
func qemuArgs(hc helperConfig) []string {
	if hc.stream {
		return streamQEMUArgs(hc)
	}
	chardev := "socket,id=" + hc.id + ",path=" + qemuEscape(hc.socket)
	if hc.client {
		chardev += ",server=on,wait=off"
	} else if hc.qemu.reconnectMS() {
		// Reconnect after a back-end restart; the guest's rings resume.
		chardev += ",reconnect-ms=1000"
	} else {
		chardev += ",reconnect=1" // QEMU < 9.2 (removed in 10.2)
	}
	netdev := "vhost-user,id=" + hc.id + ",chardev=" + hc.id
	device := "virtio-net-pci,netdev=" + hc.id
	if hc.queues > 1 {
		netdev += fmt.Sprintf(",queues=%d", hc.queues)
		device += ",mq=on"
		if !hc.tcg {
			device += fmt.Sprintf(",vectors=%d", 2*hc.queues+2)
		}
	}
	if hc.tcg {
		device += ",vectors=0"
	}
	if hc.mac != "" {
		device += ",mac=" + hc.mac
	}
	return []string{
		"-m", hc.mem,
		"-object", "memory-backend-memfd,id=" + hc.id + "-mem,size=" + hc.mem + ",share=on",
		"-numa", "node,memdev=" + hc.id + "-mem",
		"-chardev", chardev,
		"-netdev", netdev,
		"-device", device,
	}
}

// qemuEscape doubles commas, QEMU's option-value escape.
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// shellQuote quotes s for a POSIX shell when it needs quoting.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_=,./:+@%", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// xmlEscape escapes s for an XML attribute in single quotes.
func xmlEscape(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "'", "&apos;", `"`, "&quot;")
	return r.Replace(s)
}

// libvirtXML returns the elements a libvirt domain needs to use vunet:
// shared memory, the vhost-user interface and, with --tcg, the
// qemu:override that sets vectors=0 (FIELD-NOTES, libvirt).
func libvirtXML(hc helperConfig) string {
	var b strings.Builder
	alias := "ua-" + hc.id
	w := func(indent int, format string, a ...any) {
		b.WriteString(strings.Repeat("  ", indent))
		fmt.Fprintf(&b, format, a...)
		b.WriteByte('\n')
	}
	memoryBacking := func(in int) {
		w(in, "<!-- vhost-user needs the guest RAM shared with the back-end -->")
		w(in, "<memoryBacking>")
		w(in+1, "<source type='memfd'/>")
		w(in+1, "<access mode='shared'/>")
		w(in, "</memoryBacking>")
	}
	iface := func(in int) {
		w(in, "<interface type='vhostuser'>")
		if hc.mac != "" {
			w(in+1, "<mac address='%s'/>", hc.mac)
		}
		if hc.client {
			// vunet --connect: QEMU (libvirt) owns the listening socket.
			w(in+1, "<source type='unix' path='%s' mode='server'/>", xmlEscape(hc.socket))
		} else {
			w(in+1, "<source type='unix' path='%s' mode='client'>", xmlEscape(hc.socket))
			w(in+2, "<reconnect enabled='yes' timeout='2'/>")
			w(in+1, "</source>")
		}
		w(in+1, "<model type='virtio'/>")
		if hc.queues > 1 {
			w(in+1, "<driver queues='%d'/>", hc.queues)
		}
		w(in+1, "<alias name='%s'/>", alias)
		w(in, "</interface>")
	}
	override := func(in int) {
		w(in, "<!-- QEMU 7.2 under TCG crashes with MSI-X and vhost-user: legacy INTx (vectors=0) -->")
		w(in, "<qemu:override>")
		w(in+1, "<qemu:device alias='%s'>", alias)
		w(in+2, "<qemu:frontend>")
		w(in+3, "<qemu:property name='vectors' type='unsigned' value='0'/>")
		w(in+2, "</qemu:frontend>")
		w(in+1, "</qemu:device>")
		w(in, "</qemu:override>")
	}
	if hc.domain != "" {
		w(0, "<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>")
		w(1, "<name>%s</name>", xmlEscape(hc.domain))
		w(1, "<memory unit='b'>%d</memory>", memBytes(hc.mem))
		w(1, "<vcpu>%d</vcpu>", max(1, hc.queues))
		w(1, "<os>")
		w(2, "<type arch='x86_64' machine='pc'>hvm</type>")
		w(1, "</os>")
		memoryBacking(1)
		w(1, "<devices>")
		iface(2)
		w(1, "</devices>")
		if hc.tcg {
			override(1)
		}
		w(0, "</domain>")
		return b.String()
	}
	w(0, "<!-- inside <domain> -->")
	memoryBacking(0)
	w(0, "<!-- inside <devices> -->")
	iface(0)
	if hc.tcg {
		w(0, "<!-- inside <domain>, which declares xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0' -->")
		override(0)
	}
	return b.String()
}

// memBytes converts a --mem size to bytes.
func memBytes(s string) uint64 {
	mult := uint64(1)
	switch s[len(s)-1] {
	case 'K':
		mult = 1 << 10
	case 'M':
		mult = 1 << 20
	case 'G':
		mult = 1 << 30
	case 'T':
		mult = 1 << 40
	}
	var n uint64
	for _, c := range strings.TrimRight(s, "KMGT") {
		n = n*10 + uint64(c-'0')
	}
	return n * mult
}

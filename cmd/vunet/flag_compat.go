package main

import (
	"fmt"
	"strconv"
	"strings"
)

// passt options vunet accepts but cannot honour. A management stack that
// starts passt may pass any of them (QEMU's -netdev passt builds
// --freebind, --outbound-if4, --map-guest-addr from its properties and
// appends param= verbatim), and refusing to start would take the guest's
// network away for a refinement. Each is accepted and named in a one-line
// start-up warning, never ignored silently.

// unsupportedOption is one such option and why vunet cannot honour it.
type unsupportedOption struct {
	names []string // spellings, long first
	arg   string   // value name for --help; "" for a switch
	why   string
	// honoured, when set, says that this value has passt's meaning in
	// vunet too (--map-guest-addr none is passt's default), so it is
	// accepted without a warning.
	honoured func(value string) bool
	// check validates the value as passt does (it refuses garbage).
	check func(value string) error
}

var unsupportedOptions = []unsupportedOption{
	{names: []string{"map-guest-addr"}, arg: "ADDR",
		why:      "connections to ADDR are not translated to the guest's own address",
		honoured: func(v string) bool { return v == "none" },
		check:    addrOrNone},
	{names: []string{"outbound-if4"}, arg: "NAME", why: "outbound IPv4 sockets are not bound to an interface; the routing table picks it", check: ifaceName},
	{names: []string{"outbound-if6"}, arg: "NAME", why: "outbound IPv6 sockets are not bound to an interface; the routing table picks it", check: ifaceName},
	{names: []string{"freebind"}, why: "forwarded ports bind only addresses the host has (no IP_FREEBIND)"},
	{names: []string{"stats"}, arg: "DELAY", why: "no periodic event statistics; --metrics serves counters", check: positiveInt},
	{names: []string{"migrate-exit"}, why: "a migration source keeps serving (its next guest, or the same one after a failed migration)"},
	{names: []string{"migrate-no-linger"}, why: "a migration source forgets the flows the destination took at once; there is nothing to linger"},
	{names: []string{"conf-path", "c"}, arg: "PATH", why: "no configuration socket"},
	{names: []string{"chroot-fallback"}, why: "vunet does not pivot_root into an empty filesystem, so there is nothing to fall back from"},
}

// unsupportedValue records a use of an unsupportedOption.
type unsupportedValue struct {
	o   *options
	opt *unsupportedOption
}

func (u unsupportedValue) IsBoolFlag() bool { return u.opt != nil && u.opt.arg == "" }

func (u unsupportedValue) String() string { return "" }

func (u unsupportedValue) Set(s string) error {
	name := dashed(u.opt.names[0])
	if u.opt.arg == "" {
		on, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("want true or false")
		}
		if on {
			u.o.warnings = append(u.o.warnings, fmt.Sprintf("%s accepted but not supported: %s", name, u.opt.why))
		}
		return nil
	}
	if u.opt.check != nil {
		if err := u.opt.check(s); err != nil {
			return err
		}
	}
	if u.opt.honoured != nil && u.opt.honoured(s) {
		return nil
	}
	u.o.warnings = append(u.o.warnings, fmt.Sprintf("%s %s accepted but not supported: %s", name, strconv.Quote(s), u.opt.why))
	return nil
}

func addrOrNone(s string) error {
	if s == "none" {
		return nil
	}
	_, err := parseAddr(s)
	return err
}

func ifaceName(s string) error {
	if s == "" || len(s) > 15 || strings.ContainsAny(s, "/ \t\n") {
		return fmt.Errorf("not an interface name")
	}
	return nil
}

func positiveInt(s string) error {
	if n, err := strconv.ParseInt(s, 0, 64); err != nil || n < 0 {
		return fmt.Errorf("want a non-negative number")
	}
	return nil
}

// pastaOnly are pasta's options (namespace mode), which passt refuses
// with "is for pasta mode only"; vunet does the same rather than calling
// them unknown.
var pastaOnly = map[string]bool{
	"I": true, "ns-ifname": true, "T": true, "tcp-ns": true, "U": true, "udp-ns": true,
	"userns": true, "netns": true, "ns-mac-addr": true, "dhcp-dns": true, "dhcp-search": true,
	"no-netns-quit": true, "config-net": true, "no-copy-routes": true, "no-copy-addrs": true,
	"netns-only": true, "host-lo-to-ns-lo": true, "splice-only": true,
}

// helpLine is the option's --help text; a value's name is in back quotes
// for flag.UnquoteUsage.
func (u *unsupportedOption) helpLine() string {
	if u.arg == "" {
		return "ignored: " + u.why
	}
	return "takes `" + u.arg + "`, ignored: " + u.why
}

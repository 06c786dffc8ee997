package main

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"vunet/test/callers"
)

// TestLastOptionWins: contradicting and repeated options follow passt's
// getopt loop, where the later one overrides.
func TestLastOptionWins(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		name  string
		args  []string
		check func(*options) bool
	}{
		{"-q -d", []string{"-s", "x", "-q", "-d"}, func(o *options) bool { return o.logLevel == "debug" }},
		{"-d -q", []string{"-s", "x", "-d", "-q"}, func(o *options) bool { return o.logLevel == "warn" }},
		{"QEMU --quiet, param=--debug", []string{"-s", "x", "--quiet", "--mtu", "1500", "--debug"}, func(o *options) bool { return o.logLevel == "debug" }},
		{"--trace then -q", []string{"-s", "x", "--trace", "-q"}, func(o *options) bool { return o.logLevel == "warn" && !o.trace }},
		{"-q then --trace", []string{"-s", "x", "-q", "--trace"}, func(o *options) bool { return o.logLevel == "debug" && o.trace }},
		{"--log-level then -d", []string{"-s", "x", "--log-level", "error", "-d"}, func(o *options) bool { return o.logLevel == "debug" }},
		{"-d then --log-level", []string{"-s", "x", "-d", "--log-level", "error"}, func(o *options) bool { return o.logLevel == "error" }},
		{"-4 -6", []string{"-s", "x", "-4", "-6"}, func(o *options) bool { return !o.only4 && o.only6 }},
		{"-6 -4", []string{"-s", "x", "-6", "-4"}, func(o *options) bool { return o.only4 && !o.only6 }},
		{"-s then -F", []string{"-s", "x", "-F", "3"}, func(o *options) bool { return o.socket == "" && o.fd == 3 && o.oneOff }},
		{"-F then -s keeps one-off", []string{"-F", "3", "-s", "x"}, func(o *options) bool { return o.socket == "x" && o.fd == -1 && o.oneOff }},
		{"--connect then -s", []string{"--connect", "c", "-s", "x"}, func(o *options) bool { return o.socket == "x" && o.connect == "" }},
		{"-s then --connect", []string{"-s", "x", "--connect", "c"}, func(o *options) bool { return o.socket == "" && o.connect == "c" }},
		{"-a twice per family", []string{"-s", "x", "-a", "10.0.0.1", "-a", "fd00::1", "--address", "10.0.0.2"}, func(o *options) bool {
			return o.addr4 == a("10.0.0.2") && o.addr6 == a("fd00::1")
		}},
		{"-g, -o, --dns-forward twice", []string{"-s", "x", "-g", "10.0.0.1", "-g", "10.0.0.9", "-o", "192.0.2.1", "-o", "192.0.2.2", "--dns-forward", "10.0.0.3", "--dns-forward", "10.0.0.4"}, func(o *options) bool {
			return o.gw4 == a("10.0.0.9") && o.outbound4 == a("192.0.2.2") && o.dnsForward4 == a("10.0.0.4")
		}},
		{"-M twice", []string{"-s", "x", "-M", "02:00:00:00:00:01", "-M", "02:00:00:00:00:02"}, func(o *options) bool { return o.ourMAC.mac.String() == "02:00:00:00:00:02" }},
		{"-D none then address", []string{"-s", "x", "-D", "1.1.1.1", "-D", "none", "-D", "9.9.9.9"}, func(o *options) bool {
			return !o.dnsNone && len(o.dns) == 1 && o.dns[0] == a("9.9.9.9")
		}},
		{"-D address then none", []string{"-s", "x", "-D", "1.1.1.1", "-D", "none"}, func(o *options) bool { return o.dnsNone && len(o.dns) == 0 }},
		{"-S none then domain", []string{"-s", "x", "-S", "a.example", "-S", "none", "-S", "b.example"}, func(o *options) bool {
			return !o.searchNone && strings.Join(o.search, ",") == "b.example"
		}},
		{"--map-host-loopback after --no-map-gw", []string{"-s", "x", "--no-map-gw", "--map-host-loopback", "10.0.0.1"}, func(o *options) bool {
			return o.noMapGW && o.mapHostLoopback == "10.0.0.1"
		}},
		{"--map-host-loopback none then address", []string{"-s", "x", "--map-host-loopback", "none", "--map-host-loopback", "10.0.0.1"}, func(o *options) bool {
			return o.mapHostLoopback == "10.0.0.1" && !o.mapHostLoopbackNone
		}},
		{"-4 with an IPv6 address (unused, as in passt)", []string{"-s", "x", "-4", "-a", "2001:db8::1"}, func(o *options) bool { return o.only4 && o.addr6.IsValid() }},
		{"-6 with a netmask (unused, as in passt)", []string{"-s", "x", "-6", "-n", "24"}, func(o *options) bool { return o.only6 && o.prefix4 == 24 }},
		{"-m twice", []string{"-s", "x", "-m", "1500", "-m", "9000"}, func(o *options) bool { return o.mtu == 9000 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(o) {
				t.Errorf("%q: got %+v", tt.args, o)
			}
		})
	}
}

// TestAddressPrefix: newer passt takes -a ADDR/PREFIXLEN; with -n as well
// it is a redundant prefix, an error, in either order.
func TestAddressPrefix(t *testing.T) {
	o, err := parseFlags([]string{"-s", "x", "-a", "10.1.2.3/16", "-a", "fd00::5/56"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.addr4 != netip.MustParseAddr("10.1.2.3") || o.prefix4 != 16 || o.addr6 != netip.MustParseAddr("fd00::5") || o.prefix6 != 56 {
		t.Errorf("got addr4 %v/%d addr6 %v/%d", o.addr4, o.prefix4, o.addr6, o.prefix6)
	}
	for _, args := range [][]string{
		{"-s", "x", "-a", "10.1.2.3/16", "-n", "24"},
		{"-s", "x", "-n", "24", "-a", "10.1.2.3/16"},
		{"-s", "x", "-a", "10.1.2.3/33"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
}

// TestPasstOnlyOptionsWarn: every passt option vunet cannot honour is
// accepted and named in a start-up warning; values passt refuses are
// refused; a value with passt's default meaning warns nothing.
func TestPasstOnlyOptionsWarn(t *testing.T) {
	for _, u := range unsupportedOptions {
		args := []string{"-s", "x", "--" + u.names[0]}
		if u.arg != "" {
			args = append(args, map[string]string{"ADDR": "10.0.0.9", "NAME": "eth0", "BYTES": "1048576", "DELAY": "5", "PATH": "/tmp/p"}[u.arg])
		}
		o, err := parseFlags(args, &bytes.Buffer{})
		if err != nil {
			t.Errorf("%q: %v", args, err)
			continue
		}
		if len(o.warnings) != 1 || !strings.HasPrefix(o.warnings[0], "--"+u.names[0]+" ") || strings.Contains(o.warnings[0], "\n") {
			t.Errorf("%q: warnings %q, want one line naming it", args, o.warnings)
		}
		sc, err := buildStackConfigFake(t, o)
		if err != nil {
			t.Errorf("%q: %v", args, err)
		} else if !contains(sc.warnings, o.warnings[0]) {
			t.Errorf("%q: start-up warnings %q lack %q", args, sc.warnings, o.warnings[0])
		}
	}
	for _, args := range [][]string{
		{"-s", "x", "--map-guest-addr", "none"},
		{"-s", "x", "--no-splice"},
		{"-s", "x", "--freebind=false"},
	} {
		o, err := parseFlags(args, &bytes.Buffer{})
		if err != nil || len(o.warnings) != 0 {
			t.Errorf("%q: err %v warnings %q, want neither", args, err, o.warnings)
		}
	}
	for _, args := range [][]string{
		{"-s", "x", "--map-guest-addr", "host"},
		{"-s", "x", "--log-size", "big"},
		{"-s", "x", "--outbound-if4", "a/b"},
		{"-s", "x", "-c"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
}

// TestPastaOnlyOptions are refused as passt refuses them.
func TestPastaOnlyOptions(t *testing.T) {
	for _, args := range [][]string{{"--netns", "x"}, {"-T", "22"}, {"--config-net"}} {
		_, err := parseFlags(append([]string{"-s", "x"}, args...), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), args[0]+" is for pasta mode only") {
			t.Errorf("%q: %v", args, err)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// buildStackConfigFake builds the stack configuration on a fixed fake
// host.
func buildStackConfigFake(t *testing.T, o *options) (*stackConfig, error) {
	t.Helper()
	fakeHost(t, hostWithRoutes(), "")
	return buildStackConfig(o)
}

// TestCallerArgumentLists parses the exact command lines libvirt and QEMU
// build (package callers) with every option they can emit, and checks
// what each means to vunet.
func TestCallerArgumentLists(t *testing.T) {
	a := netip.MustParseAddr
	full := callers.LibvirtNet{
		VhostUser: true, Socket: "/run/libvirt/qemu/passt/1-g-net0.socket", PIDFile: "/run/libvirt/qemu/passt/1-g-net0-passt.pid",
		MAC: "52:54:00:12:34:56", MTU: 9000, SourceDev: "eth0", LogFile: "/var/log/passt.log",
		Hostname: "guest", FQDN: "guest.example",
		IPs: []callers.LibvirtIP{{Address: "10.0.2.15", Prefix: 24}, {Address: "fd00::15"}},
		PortForwards: []callers.LibvirtPortForward{
			{Proto: "tcp", Ranges: []callers.LibvirtRange{{Start: 2222, To: 22}, {Start: 8000, End: 8010, To: 9000}}},
			{Proto: "udp", Address: "127.0.0.1", Dev: "lo", Ranges: []callers.LibvirtRange{{Start: 5000, End: 5020}, {Start: 5010, End: 5015, Exclude: true}}},
			{Proto: "tcp", Address: "127.0.0.1", Dev: "lo"}, // no ranges: "all" on that address
		},
	}
	libvirtCheck := func(t *testing.T, o *options) {
		if o.socket != full.Socket || !o.oneOff || o.mtu != 9000 || o.iface != "eth0" || o.logFile != full.LogFile ||
			o.addr4 != a("10.0.2.15") || o.prefix4 != 24 || o.addr6 != a("fd00::15") ||
			len(o.tcpPorts.Specs) != 2 || len(o.udpPorts.Specs) != 1 || len(o.warnings) != 0 {
			t.Errorf("got %+v", o)
		}
	}
	qemu := callers.QEMUPasst{
		VhostUser: true, MTU: 65520, Address: "10.0.2.15", Netmask: "255.255.255.0", MAC: "9a:55:9a:55:9a:56",
		Gateway: "10.0.2.2", Interface: "eth0", Outbound: "192.0.2.10", OutboundIf4: "eth0", OutboundIf6: "eth0",
		DNS: "10.0.2.3", FQDN: "guest.example", DHCPDNS: callers.Bool(false), DHCPSearch: callers.Bool(false),
		MapHostLoopback: "10.0.2.2", MapGuestAddr: "10.0.2.4", DNSForward: "10.0.2.2", DNSHost: "127.0.0.53",
		TCP: callers.Bool(true), UDP: callers.Bool(true), ICMP: callers.Bool(false), DHCP: callers.Bool(true),
		NDP: callers.Bool(false), DHCPv6: callers.Bool(false), RA: callers.Bool(false), Freebind: callers.Bool(true),
		IPv6: callers.Bool(false), Search: []string{"a.example", "b.example"},
		TCPPorts: []string{"2222:22", "8080"}, UDPPorts: []string{"5353"}, Param: []string{"--debug"},
	}
	for _, tc := range []struct {
		name  string
		argv  []string
		check func(*testing.T, *options)
	}{
		{"libvirt 9.0.0", callers.Libvirt90(full), func(t *testing.T, o *options) {
			libvirtCheck(t, o)
			if o.vhostUser || o.ourMAC.mac.String() != full.MAC {
				t.Errorf("vhost-user %v, --mac-addr %v", o.vhostUser, o.ourMAC.mac)
			}
		}},
		{"libvirt 11.3.0", callers.Libvirt113(full), func(t *testing.T, o *options) {
			libvirtCheck(t, o)
			if !o.vhostUser || o.pidFile != full.PIDFile || o.hostname != "" {
				t.Errorf("got %+v", o)
			}
		}},
		{"libvirt master", callers.LibvirtMaster(full), func(t *testing.T, o *options) {
			libvirtCheck(t, o)
			if !o.vhostUser || o.hostname != "guest" || o.fqdn != "guest.example" {
				t.Errorf("got %+v", o)
			}
		}},
		{"QEMU 10.1", callers.QEMU101(qemu, "/tmp/passt-abc.pid"), func(t *testing.T, o *options) {
			if !o.vhostUser || o.fd != 3 || !o.oneOff || o.pidFile != "/tmp/passt-abc.pid" || o.logLevel != "debug" ||
				o.mtu != 65520 || o.addr4 != a("10.0.2.15") || o.prefix4 != 24 || o.gw4 != a("10.0.2.2") ||
				o.outbound4 != a("192.0.2.10") || len(o.dns) != 1 || o.fqdn != "guest.example" ||
				!o.noDHCPDNS || !o.noDHCPSearch || o.mapHostLoopback != "10.0.2.2" || o.dnsForward4 != a("10.0.2.2") ||
				o.dnsHost4 != a("127.0.0.53") || !o.noICMP || !o.noNDP || !o.noDHCPv6 || !o.noRA || o.noTCP || o.noDHCP ||
				!o.only4 || strings.Join(o.search, " ") != "a.example b.example" || len(o.tcpPorts.Specs) != 1 || len(o.udpPorts.Specs) != 1 {
				t.Errorf("got %+v", o)
			}
			// What vunet cannot honour is named, one warning each.
			var named []string
			for _, w := range o.warnings {
				named = append(named, strings.Fields(w)[0])
			}
			if got := strings.Join(named, " "); got != "--outbound-if4 --outbound-if6 --map-guest-addr --freebind" {
				t.Errorf("warnings name %q:\n%s", got, strings.Join(o.warnings, "\n"))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.argv[0] != "passt" {
				t.Fatalf("argv[0] %q", tc.argv[0])
			}
			o, err := parseFlags(tc.argv[1:], &bytes.Buffer{})
			if err != nil {
				t.Fatalf("%q: %v", tc.argv, err)
			}
			tc.check(t, o)
		})
	}
}

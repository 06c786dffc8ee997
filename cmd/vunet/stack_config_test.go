package main

import (
	"bytes"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"vunet/cmd/vunet/portspec"
	"vunet/tcpstack"
	"vunet/tcpstack/linksvc"
)

// fakeHost replaces the host detection for one test.
func fakeHost(t *testing.T, cfg linksvc.AddrConfig, note string) {
	t.Helper()
	old := hostDefaults
	hostDefaults = func() (linksvc.AddrConfig, string, error) { return cfg, note, nil }
	t.Cleanup(func() { hostDefaults = old })
}

var ap = netip.MustParseAddr

// hostWithRoutes is a dual-stack host with a loopback resolver.
func hostWithRoutes() linksvc.AddrConfig {
	return linksvc.AddrConfig{
		OurMAC: linksvc.DefaultOurMAC,
		IPv4:   linksvc.IPv4Config{Addr: ap("192.0.2.2"), PrefixLen: 24, Gateway: ap("192.0.2.1")},
		IPv6:   linksvc.IPv6Config{Addr: ap("2001:db8::2"), PrefixLen: 64, Gateway: ap("fe80::1"), GatewayLL: ap("fe80::1")},
		DNS4:   []netip.Addr{ap("192.0.2.1")}, DNSForward4: ap("127.0.0.53"),
		DNS6:   []netip.Addr{ap("2001:db8::53")},
		Search: []string{"host.example"},
		MTU:    linksvc.DefaultMTU,
	}
}

func mustBuild(t *testing.T, args ...string) *stackConfig {
	t.Helper()
	o, err := parseFlags(append([]string{"-s", "x"}, args...), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := buildStackConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func configErr(t *testing.T, args ...string) error {
	t.Helper()
	o, err := parseFlags(append([]string{"-s", "x"}, args...), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = buildStackConfig(o)
	return err
}

func TestStackConfigDefaults(t *testing.T) {
	fakeHost(t, hostWithRoutes(), "")
	sc := mustBuild(t)
	a := sc.cfg.Addr
	if a.IPv4.Addr != ap("192.0.2.2") || a.IPv4.PrefixLen != 24 || a.IPv4.Gateway != ap("192.0.2.1") || a.Disable4 || a.Disable6 ||
		a.IPv6.Addr != ap("2001:db8::2") || a.DNSForward4 != ap("127.0.0.53") || a.MTU != linksvc.DefaultMTU ||
		sc.cfg.NoMapGateway || len(sc.tcpForwards) != 0 || len(sc.warnings) != 0 {
		t.Fatalf("defaults changed by no flags: %+v warnings %q", sc.cfg, sc.warnings)
	}
}

func TestStackConfigOverrides(t *testing.T) {
	fakeHost(t, hostWithRoutes(), "")
	sc := mustBuild(t, "-a", "10.0.2.15", "-n", "255.255.255.0", "-g", "10.0.2.2", "-a", "2001:db8:1::15", "-M", "02:00:00:00:00:01",
		"--guest-mac", "52:54:00:00:00:01", "-m", "1500", "-D", "9.9.9.9", "-D", "2620:fe::fe", "-S", "a.example b.example",
		"--no-dhcpv6", "--no-ra", "--no-map-gw", "--max-flows", "7", "--max-tcp-flows", "9", "--tcp-sndbuf", "4096",
		"-t", "127.0.0.1/2222:22", "-t", "8000-8002,~8001")
	a := sc.cfg.Addr
	if a.IPv4 != (linksvc.IPv4Config{Addr: ap("10.0.2.15"), PrefixLen: 24, Gateway: ap("10.0.2.2")}) {
		t.Errorf("ipv4 %+v", a.IPv4)
	}
	if a.IPv6.Addr != ap("2001:db8:1::15") || a.IPv6.PrefixLen != 64 {
		t.Errorf("ipv6 %+v", a.IPv6)
	}
	if a.OurMAC.String() != "02:00:00:00:00:01" || a.GuestMAC.String() != "52:54:00:00:00:01" || a.MTU != 1500 {
		t.Errorf("mac/mtu %v %v %d", a.OurMAC, a.GuestMAC, a.MTU)
	}
	if !slices.Equal(a.DNS4, []netip.Addr{ap("9.9.9.9")}) || !slices.Equal(a.DNS6, []netip.Addr{ap("2620:fe::fe")}) ||
		!slices.Equal(a.Search, []string{"a.example", "b.example"}) {
		t.Errorf("dns %v %v search %v", a.DNS4, a.DNS6, a.Search)
	}
	if a.NoDHCP || !a.NoDHCPv6 || a.NoNDP || !a.NoRA || !sc.cfg.NoMapGateway {
		t.Errorf("switches %+v", a)
	}
	if sc.cfg.MaxFlows != 7 || sc.cfg.TCP.MaxFlows != 9 || sc.cfg.TCP.SndBuf != 4096 || sc.cfg.TCP.RcvBuf != 0 {
		t.Errorf("limits %+v", sc.cfg)
	}
	want := []portspec.Forward{
		{Addr: ap("127.0.0.1"), Host: portspec.Range{First: 2222, Last: 2222}, Guest: 22},
		{Host: portspec.Range{First: 8000, Last: 8000}, Guest: 8000},
		{Host: portspec.Range{First: 8002, Last: 8002}, Guest: 8002},
	}
	if !slices.Equal(sc.tcpForwards, want) {
		t.Errorf("forwards %v, want %v", sc.tcpForwards, want)
	}
}

func TestStackConfigFamilies(t *testing.T) {
	fakeHost(t, hostWithRoutes(), "")
	if sc := mustBuild(t, "-4"); !sc.cfg.Addr.Disable6 || sc.cfg.Addr.Disable4 {
		t.Errorf("-4: %+v", sc.cfg.Addr)
	}
	if sc := mustBuild(t, "-6"); !sc.cfg.Addr.Disable4 || sc.cfg.Addr.Disable6 {
		t.Errorf("-6: %+v", sc.cfg.Addr)
	}
	// Without a default route: link-local fallback, and the note says so.
	ll := hostWithRoutes()
	ll.IPv4 = linksvc.IPv4Config{Addr: ap("169.254.2.1"), PrefixLen: 16, Gateway: ap("169.254.2.2")}
	ll.IPv6 = linksvc.IPv6Config{GatewayLL: ap("fe80::1")}
	fakeHost(t, ll, "no default route: using link-local fallback")
	sc := mustBuild(t)
	if sc.cfg.Addr.IPv4.Addr != ap("169.254.2.1") || len(sc.notes) != 1 || !strings.Contains(sc.notes[0], "link-local") {
		t.Errorf("fallback: %+v notes %q", sc.cfg.Addr.IPv4, sc.notes)
	}
	// An address of one's own on such a host needs a gateway too.
	if err := configErr(t, "-a", "10.0.0.5"); err == nil || !strings.Contains(err.Error(), "--gateway") {
		t.Errorf("-a without route: %v", err)
	}
	if sc := mustBuild(t, "-a", "10.0.0.5", "-g", "10.0.0.1"); sc.cfg.Addr.IPv4.PrefixLen != 8 {
		t.Errorf("classful prefix %d, want 8", sc.cfg.Addr.IPv4.PrefixLen)
	}
	// IPv4-only host, -6: nothing left.
	v4only := hostWithRoutes()
	v4only.Disable6 = true
	fakeHost(t, v4only, "no ipv6 default route: ipv6 disabled")
	if err := configErr(t, "-6"); err == nil || !strings.Contains(err.Error(), "both address families") {
		t.Errorf("-6 on v4-only host: %v", err)
	}
}

func TestStackConfigDNSForwardAndMapping(t *testing.T) {
	fakeHost(t, hostWithRoutes(), "")
	sc := mustBuild(t, "--dns-forward", "192.0.2.1", "--dns-host", "10.1.1.1")
	if sc.cfg.Addr.DNSForward4 != ap("10.1.1.1") || sc.cfg.Addr.DNS4[0] != ap("192.0.2.1") {
		t.Errorf("dns forward %v dns %v", sc.cfg.Addr.DNSForward4, sc.cfg.Addr.DNS4)
	}
	// A forward at another address than the gateway is warned and left
	// out: the defaults stay, nothing announces 10.9.9.9.
	if sc := mustBuild(t, "--dns-forward", "10.9.9.9"); len(sc.warnings) != 1 || !strings.HasPrefix(sc.warnings[0], "--dns-forward 10.9.9.9 accepted but not supported") ||
		slices.Contains(sc.cfg.Addr.DNS4, ap("10.9.9.9")) || sc.cfg.Addr.DNSForward4 != ap("127.0.0.53") {
		t.Errorf("dns-forward not gateway: warnings %q dns %v forward %v", sc.warnings, sc.cfg.Addr.DNS4, sc.cfg.Addr.DNSForward4)
	}
	if sc := mustBuild(t, "--map-host-loopback", "192.0.2.1"); sc.cfg.NoMapGateway {
		t.Error("mapping the gateway disabled the mapping")
	}
	if sc := mustBuild(t, "--map-host-loopback", "none"); !sc.cfg.NoMapGateway {
		t.Error("--map-host-loopback none kept the mapping")
	}
	// With the mapping off, the loopback resolver found in resolv.conf is
	// out of reach (no forward, the gateway leaves the DNS list) unless
	// --dns-forward or --dns-host asks for it.
	for _, off := range []string{"--no-map-gw", "--map-host-loopback=none"} {
		sc := mustBuild(t, off)
		if a := sc.cfg.Addr; a.DNSForward4.IsValid() || slices.Contains(a.DNS4, ap("192.0.2.1")) {
			t.Errorf("%s: dns forward %v, dns %v: the host's loopback resolver is still reached", off, a.DNSForward4, a.DNS4)
		}
		if !slices.ContainsFunc(sc.notes, func(n string) bool { return strings.Contains(n, "127.0.0.53") }) {
			t.Errorf("%s: no note about the dropped resolver: %q", off, sc.notes)
		}
		sc = mustBuild(t, off, "--dns-forward", "192.0.2.1")
		if a := sc.cfg.Addr; a.DNSForward4 != ap("127.0.0.53") || a.DNS4[0] != ap("192.0.2.1") {
			t.Errorf("%s --dns-forward: dns forward %v, dns %v", off, a.DNSForward4, a.DNS4)
		}
		sc = mustBuild(t, off, "--dns-host", "127.0.0.53")
		if a := sc.cfg.Addr; a.DNSForward4 != ap("127.0.0.53") {
			t.Errorf("%s --dns-host: dns forward %v", off, a.DNSForward4)
		}
	}
	if sc := mustBuild(t); sc.cfg.Addr.DNSForward4 != ap("127.0.0.53") {
		t.Errorf("mapping on: dns forward %v", sc.cfg.Addr.DNSForward4)
	}
	// Another address than the gateway: warned, and nothing is mapped
	// (passt would map that address instead of the gateway).
	if sc := mustBuild(t, "--map-host-loopback", "192.0.2.77"); !sc.cfg.NoMapGateway || len(sc.warnings) != 1 ||
		!strings.HasPrefix(sc.warnings[0], "--map-host-loopback 192.0.2.77 accepted but not supported") {
		t.Errorf("map other address: mapping off %v, warnings %q", sc.cfg.NoMapGateway, sc.warnings)
	}
	// --no-map-gw with --map-host-loopback naming one family's gateway
	// maps that family only (passt: the option sets one address, and
	// --no-map-gw leaves the other family's unset); the other family's
	// loopback resolver is then not forwarded either.
	if sc := mustBuild(t, "--no-map-gw", "--map-host-loopback", "192.0.2.1"); sc.cfg.NoMapGateway || sc.cfg.NoMapGateway4 || !sc.cfg.NoMapGateway6 ||
		sc.cfg.Addr.DNSForward4 != ap("127.0.0.53") {
		t.Errorf("--no-map-gw, IPv4 gateway mapped: off %v, off4 %v, off6 %v, dns forward %v",
			sc.cfg.NoMapGateway, sc.cfg.NoMapGateway4, sc.cfg.NoMapGateway6, sc.cfg.Addr.DNSForward4)
	}
	if sc := mustBuild(t, "--no-map-gw", "--map-host-loopback", "fe80::1"); sc.cfg.NoMapGateway || !sc.cfg.NoMapGateway4 || sc.cfg.NoMapGateway6 ||
		sc.cfg.Addr.DNSForward4.IsValid() {
		t.Errorf("--no-map-gw, IPv6 gateway mapped: off %v, off4 %v, off6 %v, dns forward %v",
			sc.cfg.NoMapGateway, sc.cfg.NoMapGateway4, sc.cfg.NoMapGateway6, sc.cfg.Addr.DNSForward4)
	}
	// Without --no-map-gw the other family keeps its default mapping.
	if sc := mustBuild(t, "--map-host-loopback", "192.0.2.1"); sc.cfg.NoMapGateway4 || sc.cfg.NoMapGateway6 {
		t.Errorf("IPv4 gateway mapped: off4 %v, off6 %v", sc.cfg.NoMapGateway4, sc.cfg.NoMapGateway6)
	}
	if err := configErr(t, "-g", "192.0.2.2"); err == nil || !strings.Contains(err.Error(), "own address") {
		t.Errorf("gateway = guest: %v", err)
	}
}

func TestStackConfigInterface(t *testing.T) {
	fakeHost(t, hostWithRoutes(), "")
	old := interfaceAddrs
	interfaceAddrs = func(name string) ([]netip.Prefix, error) {
		return []netip.Prefix{netip.MustParsePrefix("fe80::5/64"), netip.MustParsePrefix("198.51.100.7/24"), netip.MustParsePrefix("2001:db8:5::7/64")}, nil
	}
	t.Cleanup(func() { interfaceAddrs = old })
	sc := mustBuild(t, "-i", "eth1")
	a := sc.cfg.Addr
	if a.IPv4 != (linksvc.IPv4Config{Addr: ap("198.51.100.7"), PrefixLen: 24, Gateway: ap("198.51.100.1")}) || a.IPv6.Addr != ap("2001:db8:5::7") {
		t.Errorf("-i: %+v %+v", a.IPv4, a.IPv6)
	}
	if len(sc.notes) != 1 || !strings.Contains(sc.notes[0], "eth1") {
		t.Errorf("notes %q", sc.notes)
	}
}

func TestStackConfigEnforcesAll(t *testing.T) {
	fakeHost(t, hostWithRoutes(), "")
	sc := mustBuild(t, "--no-icmp", "-u", "53", "-o", "192.0.2.9", "-p", "/tmp/x.pcap", "--hostname", "h")
	joined := strings.Join(sc.warnings, "\n")
	for _, w := range []string{"--udp-ports", "--pcap", "--no-icmp", "--outbound", "--hostname"} {
		if strings.Contains(joined, w) {
			t.Errorf("%s is enforced, warned anyway: %q", w, joined)
		}
	}
}

// TestStackConfigKnobs: the protocol switches, outbound addresses and
// DHCP names reach the data plane's configuration.
func TestStackConfigKnobs(t *testing.T) {
	fakeHost(t, hostWithRoutes(), "")
	for _, tc := range []struct {
		args  []string
		check func(c *tcpstack.Config) bool
	}{
		{[]string{"--no-tcp"}, func(c *tcpstack.Config) bool { return c.NoTCP && !c.NoUDP && !c.NoICMP }},
		{[]string{"--no-udp"}, func(c *tcpstack.Config) bool { return c.NoUDP && !c.NoTCP }},
		{[]string{"--no-icmp"}, func(c *tcpstack.Config) bool { return c.NoICMP && !c.NoTCP }},
		{[]string{}, func(c *tcpstack.Config) bool {
			return !c.NoTCP && !c.NoUDP && !c.NoICMP && !c.Outbound4.IsValid() && c.Addr.Hostname == ""
		}},
		{[]string{"-o", "192.0.2.9", "-o", "2001:db8::9"}, func(c *tcpstack.Config) bool {
			return c.Outbound4 == ap("192.0.2.9") && c.Outbound6 == ap("2001:db8::9")
		}},
		{[]string{"-H", "vm1", "--fqdn", "vm1.example.org"}, func(c *tcpstack.Config) bool {
			return c.Addr.Hostname == "vm1" && c.Addr.FQDN == "vm1.example.org"
		}},
	} {
		sc := mustBuild(t, tc.args...)
		if !tc.check(&sc.cfg) {
			t.Errorf("%q: config %+v", tc.args, sc.cfg)
		}
	}
	o, err := parseFlags([]string{"-s", "x", "--fqdn", "a..b"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := buildStackConfig(o); err == nil {
		t.Errorf("invalid --fqdn accepted")
	}
}

// TestStackConfigPasstSemantics: the passt options QEMU's -netdev passt
// emits that change what the guest is told or mapped, with passt's
// meaning.
func TestStackConfigPasstSemantics(t *testing.T) {
	fakeHost(t, hostWithRoutes(), "")
	// --no-dhcp-dns / --no-dhcp-search: nothing announced; the DNS
	// forwarding for a statically configured guest stays.
	sc := mustBuild(t, "--no-dhcp-dns", "--no-dhcp-search")
	if a := sc.cfg.Addr; len(a.DNS4) != 0 || len(a.DNS6) != 0 || len(a.Search) != 0 || a.DNSForward4 != ap("127.0.0.53") {
		t.Errorf("--no-dhcp-dns --no-dhcp-search: dns %v %v search %v forward %v", a.DNS4, a.DNS6, a.Search, a.DNSForward4)
	}
	if a := mustBuild(t).cfg.Addr; len(a.DNS4) == 0 || len(a.Search) == 0 {
		t.Errorf("defaults lost resolvers or search list: %+v", a)
	}
	// --no-map-gw drops only the default mapping; an explicit address
	// maps anyway (the order does not matter).
	if sc := mustBuild(t, "--no-map-gw"); !sc.cfg.NoMapGateway {
		t.Error("--no-map-gw kept the mapping")
	}
	for _, args := range [][]string{
		{"--no-map-gw", "--map-host-loopback", "192.0.2.1"},
		{"--map-host-loopback", "192.0.2.1", "--no-map-gw"},
	} {
		if sc := mustBuild(t, args...); sc.cfg.NoMapGateway {
			t.Errorf("%q: mapping off", args)
		}
	}
	// Options for a family -4 or -6 turned off are accepted and unused.
	if sc := mustBuild(t, "-4", "-a", "2001:db8::9", "--dns-forward", "fe80::1"); !sc.cfg.Addr.Disable6 || sc.cfg.Addr.Disable4 {
		t.Errorf("-4 with IPv6 options: %+v", sc.cfg.Addr)
	}
	if sc := mustBuild(t, "-6", "-n", "16", "-a", "10.0.0.9"); !sc.cfg.Addr.Disable4 || sc.cfg.Addr.Disable6 {
		t.Errorf("-6 with IPv4 options: %+v", sc.cfg.Addr)
	}
	// -a ADDR6/LEN sets the advertised prefix.
	if sc := mustBuild(t, "-a", "2001:db8:1::9/56"); sc.cfg.Addr.IPv6.Addr != ap("2001:db8:1::9") || sc.cfg.Addr.IPv6.PrefixLen != 56 {
		t.Errorf("-a ADDR6/56: %+v", sc.cfg.Addr.IPv6)
	}
}

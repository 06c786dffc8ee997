package linksvc

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"vunet/tcpstack/header"
)

func fixtureSources(route, route6 string, addrs4 map[string][]netip.Prefix) hostSources {
	return hostSources{
		route:      "testdata/addr_config/" + route,
		ipv6Route:  "testdata/addr_config/" + route6,
		ifInet6:    "testdata/addr_config/if_inet6",
		resolvConf: "testdata/addr_config/resolv.conf",
		ifAddrs4: func(ifname string) ([]netip.Prefix, error) {
			return addrs4[ifname], nil
		},
	}
}

func TestDetectHostDefaultsFromFixtures(t *testing.T) {
	addrs := map[string][]netip.Prefix{
		"eth0": {netip.MustParsePrefix("127.0.0.9/8"), netip.MustParsePrefix("172.16.3.7/16")},
		"eth1": {netip.MustParsePrefix("192.168.2.5/24")},
	}
	cfg, note, err := detectHostDefaults(fixtureSources("route", "ipv6_route", addrs))
	if err != nil {
		t.Fatal(err)
	}
	if note != "" {
		t.Errorf("unexpected note %q", note)
	}
	want := AddrConfig{
		OurMAC: header.MAC{0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55},
		IPv4: IPv4Config{
			// eth0 wins on metric (100 < 600); loopback address skipped.
			Addr: netip.MustParseAddr("172.16.3.7"), PrefixLen: 16, Gateway: netip.MustParseAddr("172.16.0.1"),
		},
		IPv6: IPv6Config{
			// Deprecated and temporary addresses lose to the stable one.
			Addr: netip.MustParseAddr("2001:db8:1:2::42"), PrefixLen: 64,
			Gateway:   netip.MustParseAddr("fe80::211:22ff:fe33:4455"),
			GatewayLL: netip.MustParseAddr("fe80::211:22ff:fe33:4455"),
		},
		// 127.0.0.53 and ::1 are reached through the gateway addresses; the
		// zoned link-local resolver is dropped.
		DNS4:        []netip.Addr{netip.MustParseAddr("172.16.0.1"), netip.MustParseAddr("192.0.2.53")},
		DNS6:        []netip.Addr{netip.MustParseAddr("2001:db8::53"), netip.MustParseAddr("fe80::211:22ff:fe33:4455")},
		DNSForward4: netip.MustParseAddr("127.0.0.53"),
		DNSForward6: netip.MustParseAddr("::1"),
		Search:      []string{"corp.example.com", "lab.example.com"},
		MTU:         65520,
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got  %+v\nwant %+v", cfg, want)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("detected config does not validate: %v", err)
	}
	if cfg.Prefix4() != netip.MustParsePrefix("172.16.0.0/16") || cfg.Prefix6() != netip.MustParsePrefix("2001:db8:1:2::/64") {
		t.Errorf("prefixes %v %v", cfg.Prefix4(), cfg.Prefix6())
	}
}

func TestDetectHostDefaultsFallbacks(t *testing.T) {
	addrs := map[string][]netip.Prefix{
		"eth0": {netip.MustParsePrefix("172.16.3.7/16")},
		"wg0":  {netip.MustParsePrefix("10.8.0.1/24")},
	}
	tests := []struct {
		name, route, route6 string
		note                string
		check               func(t *testing.T, c AddrConfig)
	}{
		{"no-default-route", "route_none", "ipv6_route_none", "no default route: using link-local fallback",
			func(t *testing.T, c AddrConfig) {
				if c.IPv4.Addr != netip.MustParseAddr("169.254.2.1") || c.IPv4.PrefixLen != 16 || c.IPv4.Gateway != netip.MustParseAddr("169.254.2.2") {
					t.Errorf("ipv4 %+v", c.IPv4)
				}
				if c.IPv6.Addr.IsValid() || c.IPv6.GatewayLL != netip.MustParseAddr("fe80::1") || c.Disable4 || c.Disable6 {
					t.Errorf("ipv6 %+v disable %v %v", c.IPv6, c.Disable4, c.Disable6)
				}
				if err := c.Validate(); err != nil {
					t.Error(err)
				}
			}},
		{"no-ipv6-file", "route", "does-not-exist", "no ipv6 default route: ipv6 disabled",
			func(t *testing.T, c AddrConfig) {
				if !c.Disable6 || c.Disable4 || len(c.DNS6) != 0 || c.DNSForward6.IsValid() {
					t.Errorf("disable6 %v dns6 %v", c.Disable6, c.DNS6)
				}
			}},
		{"ipv6-only", "route_none", "ipv6_route", "no ipv4 default route: ipv4 disabled",
			func(t *testing.T, c AddrConfig) {
				if !c.Disable4 || c.Disable6 || c.DNSForward4.IsValid() {
					t.Errorf("disable4 %v", c.Disable4)
				}
			}},
		{"device-route", "route_devonly", "ipv6_route_none", "has no gateway: using 10.8.0.2",
			func(t *testing.T, c AddrConfig) {
				if c.IPv4.Gateway != netip.MustParseAddr("10.8.0.2") {
					t.Errorf("gateway %v", c.IPv4.Gateway)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, note, err := detectHostDefaults(fixtureSources(tt.route, tt.route6, addrs))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(note, tt.note) {
				t.Errorf("note %q, want it to contain %q", note, tt.note)
			}
			tt.check(t, cfg)
		})
	}
}

func TestDetectHostDefaultsErrors(t *testing.T) {
	src := fixtureSources("route_bad", "ipv6_route", nil)
	if _, _, err := detectHostDefaults(src); err == nil || !strings.Contains(err.Error(), "route_bad") {
		t.Errorf("bad route file: err %v", err)
	}
	src = fixtureSources("missing", "ipv6_route", nil)
	if _, _, err := detectHostDefaults(src); err == nil {
		t.Error("missing /proc/net/route accepted")
	}
}

// TestDetectHostDefaultsOnThisHost only checks that the real host files
// parse; what they contain depends on the machine.
func TestDetectHostDefaultsOnThisHost(t *testing.T) {
	cfg, note, err := DetectHostDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("host config %+v (note %q) does not validate: %v", cfg, note, err)
	}
	t.Logf("host defaults: %+v note %q", cfg, note)
}

func TestParseResolvConf(t *testing.T) {
	rc, err := parseResolvConf(strings.NewReader("domain a.example\nnameserver 10.0.0.1\nnameserver bogus\nsearch b.example bad..name c.example\n#nameserver 10.0.0.2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rc.servers, []netip.Addr{netip.MustParseAddr("10.0.0.1")}) || !reflect.DeepEqual(rc.search, []string{"b.example", "c.example"}) {
		t.Errorf("got %+v", rc)
	}
}

func TestAddrConfigValidate(t *testing.T) {
	good := AddrConfig{OurMAC: header.MAC(DefaultOurMAC), IPv4: IPv4Config{Addr: netip.MustParseAddr("10.0.0.2"), PrefixLen: 24}}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []func(c *AddrConfig){
		func(c *AddrConfig) { c.OurMAC = header.MAC{} },
		func(c *AddrConfig) { c.OurMAC = header.BroadcastMAC },
		func(c *AddrConfig) { c.IPv4.Addr = netip.MustParseAddr("::1") },
		func(c *AddrConfig) { c.IPv4.PrefixLen = 33 },
		func(c *AddrConfig) { c.IPv6.Addr = netip.MustParseAddr("2001:db8::1") }, // prefix length 0
		func(c *AddrConfig) { c.MTU = 67 },
	}
	for i, mutate := range bad {
		c := good
		mutate(&c)
		if c.Validate() == nil {
			t.Errorf("case %d: invalid config accepted", i)
		}
	}
	if good.EffectiveMTU() != DefaultMTU || good.RouterLL() != DefaultGatewayLL {
		t.Error("defaults")
	}
}

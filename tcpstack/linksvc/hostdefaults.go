package linksvc

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"vunet/tcpstack/header"
)

// What the guest is told by default is the host's own configuration, as
// passt does: read here from /proc and /etc/resolv.conf.

// hostSources names where host defaults are read from, so tests can point
// at fixture files.
type hostSources struct {
	route, ipv6Route, ifInet6, resolvConf string
	// ifAddrs4 returns the IPv4 prefixes configured on an interface.
	ifAddrs4 func(ifname string) ([]netip.Prefix, error)
}

var systemSources = hostSources{
	route:      "/proc/net/route",
	ipv6Route:  "/proc/net/ipv6_route",
	ifInet6:    "/proc/net/if_inet6",
	resolvConf: "/etc/resolv.conf",
	ifAddrs4:   interfaceAddrs4,
}

// DetectHostDefaults builds the passt-like default configuration from the
// host: for each family, the interface of the lowest-metric default route,
// its first global address and prefix, and the route's gateway; resolvers
// and search list from /etc/resolv.conf. A family without a default route
// is disabled; with neither, a fixed link-local configuration is returned
// (guest 169.254.2.1/16, gateway 169.254.2.2, IPv6 link-local only via
// fe80::1). note explains any such fallback for the log; err is returned
// only when the host files cannot be read or parsed at all.
func DetectHostDefaults() (AddrConfig, string, error) {
	return detectHostDefaults(systemSources)
}

func detectHostDefaults(src hostSources) (AddrConfig, string, error) {
	cfg := AddrConfig{OurMAC: header.MAC(DefaultOurMAC), MTU: DefaultMTU}
	var notes []string

	route4, err := readWith(src.route, parseProcRoute)
	if err != nil {
		return cfg, "", err
	}
	route6, err := readWith(src.ipv6Route, parseProcIPv6Route)
	if err != nil && !errors.Is(err, os.ErrNotExist) { // IPv6 disabled in the kernel
		return cfg, "", err
	}

	if route4.ok {
		prefixes, err := src.ifAddrs4(route4.ifname)
		if err != nil {
			return cfg, "", fmt.Errorf("addresses of %s: %w", route4.ifname, err)
		}
		if p, ok := pickPrefix4(prefixes); ok {
			cfg.IPv4 = IPv4Config{Addr: p.Addr(), PrefixLen: p.Bits(), Gateway: route4.gateway}
			if !route4.gateway.IsValid() {
				cfg.IPv4.Gateway = gatewayForPrefix(p)
				notes = append(notes, fmt.Sprintf("ipv4 default route on %s has no gateway: using %v", route4.ifname, cfg.IPv4.Gateway))
			}
		} else {
			route4.ok = false
			notes = append(notes, fmt.Sprintf("ipv4 default route interface %s has no usable address", route4.ifname))
		}
	}
	if route6.ok {
		list, err := readWith(src.ifInet6, parseIfInet6)
		if err != nil {
			return cfg, "", err
		}
		if p, ok := pickPrefix6(list, route6.ifname); ok {
			cfg.IPv6 = IPv6Config{Addr: p.Addr(), PrefixLen: p.Bits(), Gateway: route6.gateway, GatewayLL: DefaultGatewayLL}
			if route6.gateway.IsLinkLocalUnicast() {
				cfg.IPv6.GatewayLL = route6.gateway
			}
		} else {
			route6.ok = false
			notes = append(notes, fmt.Sprintf("ipv6 default route interface %s has no global address", route6.ifname))
		}
	}

	switch {
	case !route4.ok && !route6.ok:
		cfg.IPv4 = IPv4Config{Addr: fallbackGuest4, PrefixLen: fallbackPrefixLen4, Gateway: fallbackGateway4}
		cfg.IPv6 = IPv6Config{GatewayLL: DefaultGatewayLL}
		notes = append(notes, "no default route: using link-local fallback (guest 169.254.2.1/16 via 169.254.2.2, IPv6 link-local via fe80::1)")
	case !route4.ok:
		cfg.Disable4 = true
		notes = append(notes, "no ipv4 default route: ipv4 disabled")
	case !route6.ok:
		cfg.Disable6 = true
		notes = append(notes, "no ipv6 default route: ipv6 disabled")
	}

	rc, err := readWith(src.resolvConf, parseResolvConf)
	switch {
	case errors.Is(err, os.ErrNotExist):
		notes = append(notes, "no "+src.resolvConf+": no DNS servers for the guest")
	case err != nil:
		return cfg, "", err
	}
	cfg.Search = rc.search
	for _, a := range rc.servers {
		switch {
		case a.Is4() && cfg.Disable4, !a.Is4() && cfg.Disable6:
		case a.Is4() && a.IsLoopback():
			// The guest reaches a host loopback resolver through the gateway.
			if !cfg.DNSForward4.IsValid() {
				cfg.DNSForward4 = a
				cfg.DNS4 = append(cfg.DNS4, cfg.IPv4.Gateway)
			}
		case a.Is4():
			cfg.DNS4 = append(cfg.DNS4, a)
		case a.IsLoopback():
			if !cfg.DNSForward6.IsValid() {
				cfg.DNSForward6 = a
				cfg.DNS6 = append(cfg.DNS6, cfg.RouterLL())
			}
		case a.Zone() != "" || a.IsLinkLocalUnicast():
			// A host-side link-local resolver is on another link.
		default:
			cfg.DNS6 = append(cfg.DNS6, a)
		}
	}
	return cfg, strings.Join(notes, "; "), nil
}

func readWith[T any](path string, parse func(io.Reader) (T, error)) (T, error) {
	f, err := os.Open(path)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("read host defaults: %w", err)
	}
	defer f.Close()
	v, err := parse(f)
	if err != nil {
		return v, fmt.Errorf("parse %s: %w", path, err)
	}
	return v, nil
}

// defaultRoute is the chosen default route of one family.
type defaultRoute struct {
	ok      bool
	ifname  string
	gateway netip.Addr // invalid for a direct (device) route
	metric  uint32
}

// Route flags from linux/route.h.
const (
	rtfUp      = 0x0001
	rtfGateway = 0x0002
	rtfReject  = 0x0200
)

// parseProcRoute picks the lowest-metric usable IPv4 default route from
// /proc/net/route.
func parseProcRoute(r io.Reader) (defaultRoute, error) {
	var best defaultRoute
	sc := bufio.NewScanner(r)
	for line := 0; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if line == 0 || len(f) < 8 {
			continue // header
		}
		dst, err1 := strconv.ParseUint(f[1], 16, 32)
		gw, err2 := strconv.ParseUint(f[2], 16, 32)
		flags, err3 := strconv.ParseUint(f[3], 16, 32)
		metric, err4 := strconv.ParseUint(f[6], 10, 32)
		mask, err5 := strconv.ParseUint(f[7], 16, 32)
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
			return best, fmt.Errorf("line %d: %w", line+1, err)
		}
		if dst != 0 || mask != 0 || flags&rtfUp == 0 || flags&rtfReject != 0 || f[0] == "lo" {
			continue
		}
		if best.ok && uint32(metric) >= best.metric {
			continue
		}
		rt := defaultRoute{ok: true, ifname: f[0], metric: uint32(metric)}
		if flags&rtfGateway != 0 && gw != 0 {
			// The kernel prints the network-order word as a host integer.
			var b [4]byte
			binary.NativeEndian.PutUint32(b[:], uint32(gw))
			rt.gateway = netip.AddrFrom4(b)
		}
		best = rt
	}
	return best, sc.Err()
}

// parseProcIPv6Route picks the lowest-metric usable IPv6 default route from
// /proc/net/ipv6_route.
func parseProcIPv6Route(r io.Reader) (defaultRoute, error) {
	var best defaultRoute
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			continue
		}
		dst, err1 := parseHex16(f[0])
		dstLen, err2 := strconv.ParseUint(f[1], 16, 8)
		gw, err3 := parseHex16(f[4])
		metric, err4 := strconv.ParseUint(f[5], 16, 32)
		flags, err5 := strconv.ParseUint(f[8], 16, 32)
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
			return best, fmt.Errorf("line %d: %w", line, err)
		}
		if dst != ([16]byte{}) || dstLen != 0 || flags&rtfUp == 0 || flags&rtfReject != 0 || f[9] == "lo" {
			continue
		}
		if best.ok && uint32(metric) >= best.metric {
			continue
		}
		rt := defaultRoute{ok: true, ifname: f[9], metric: uint32(metric)}
		if gw != ([16]byte{}) {
			rt.gateway = netip.AddrFrom16(gw)
		}
		best = rt
	}
	return best, sc.Err()
}

func parseHex16(s string) ([16]byte, error) {
	var a [16]byte
	if len(s) != 32 {
		return a, fmt.Errorf("address %q: want 32 hex digits", s)
	}
	_, err := hex.Decode(a[:], []byte(s))
	return a, err
}

// ifInet6Entry is one line of /proc/net/if_inet6.
type ifInet6Entry struct {
	prefix netip.Prefix
	scope  uint8
	flags  uint8
	ifname string
}

// Address flags from linux/if_addr.h.
const (
	ifaTemporary  = 0x01
	ifaDadFailed  = 0x08
	ifaDeprecated = 0x20
	ifaTentative  = 0x40
)

func parseIfInet6(r io.Reader) ([]ifInet6Entry, error) {
	var out []ifInet6Entry
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		a, err1 := parseHex16(f[0])
		plen, err2 := strconv.ParseUint(f[2], 16, 8)
		scope, err3 := strconv.ParseUint(f[3], 16, 8)
		flags, err4 := strconv.ParseUint(f[4], 16, 8)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return out, fmt.Errorf("line %d: %w", line, err)
		}
		if plen > 128 {
			return out, fmt.Errorf("line %d: prefix length %d", line, plen)
		}
		out = append(out, ifInet6Entry{prefix: netip.PrefixFrom(netip.AddrFrom16(a), int(plen)), scope: uint8(scope), flags: uint8(flags), ifname: f[5]})
	}
	return out, sc.Err()
}

// pickPrefix6 returns the first usable global address on ifname, preferring
// stable addresses over temporary (privacy) ones.
func pickPrefix6(list []ifInet6Entry, ifname string) (netip.Prefix, bool) {
	var temp netip.Prefix
	for _, e := range list {
		a := e.prefix.Addr()
		if e.ifname != ifname || e.scope != 0 || !a.IsGlobalUnicast() || e.flags&(ifaDadFailed|ifaDeprecated|ifaTentative) != 0 {
			continue
		}
		if e.flags&ifaTemporary != 0 {
			if !temp.IsValid() {
				temp = e.prefix
			}
			continue
		}
		return e.prefix, true
	}
	return temp, temp.IsValid()
}

// pickPrefix4 returns the first global (or private) unicast IPv4 prefix.
func pickPrefix4(list []netip.Prefix) (netip.Prefix, bool) {
	for _, p := range list {
		a := p.Addr().Unmap()
		if a.Is4() && a.IsGlobalUnicast() {
			return netip.PrefixFrom(a, p.Bits()), true
		}
	}
	return netip.Prefix{}, false
}

// gatewayForPrefix picks a gateway for a device route without one: the
// first host address of the prefix, or the second if that is ours.
func gatewayForPrefix(p netip.Prefix) netip.Addr {
	gw := p.Masked().Addr().Next()
	if gw == p.Addr() {
		gw = gw.Next()
	}
	if !p.Contains(gw) {
		return fallbackGateway4
	}
	return gw
}

func interfaceAddrs4(ifname string) ([]netip.Prefix, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, err
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if p, ok := netip.AddrFromSlice(n.IP); ok {
				ones, _ := n.Mask.Size()
				if p.Unmap().Is4() && ones > 0 && ones <= 32 {
					out = append(out, netip.PrefixFrom(p.Unmap(), ones))
				}
			}
		}
	}
	return out, nil
}

// resolvConf is what we take from /etc/resolv.conf.
type resolvConf struct {
	servers []netip.Addr
	search  []string
}

// parseResolvConf reads nameserver, search and domain lines; the last of
// search/domain wins, as in glibc.
func parseResolvConf(r io.Reader) (resolvConf, error) {
	var rc resolvConf
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if a, err := netip.ParseAddr(f[1]); err == nil {
				rc.servers = append(rc.servers, a)
			}
		case "search":
			rc.search = nil
			for _, d := range f[1:] {
				if header.DomainNameEncodedLen(d) > 1 {
					rc.search = append(rc.search, strings.TrimSuffix(d, "."))
				}
			}
		case "domain":
			if header.DomainNameEncodedLen(f[1]) > 1 {
				rc.search = []string{strings.TrimSuffix(f[1], ".")}
			}
		}
	}
	return rc, sc.Err()
}

package linksvc

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
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

package control

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"vunet/cmd/vunet/portspec"
	"vunet/tcpstack"
)

// Families says which address families the guest has: a forward without a
// bind address listens on the wildcard address of each.
type Families struct{ Disable4, Disable6 bool }

// StackForwards turns port-spec forwards into the Stack's, one per port
// and address family: a forward without a bind address listens on every
// IPv4 and every IPv6 address (of the families not disabled), its IPv6
// twin Optional (a host without IPv6). bestEffort makes every one Optional
// (passt's rule for "all" and exclusion-only specifications). The daemon's
// command line and the control endpoint both use it.
func StackForwards(fws []portspec.Forward, fam Families, bestEffort bool) []tcpstack.Forward {
	var out []tcpstack.Forward
	for _, fw := range fws {
		var addrs []netip.Addr
		switch {
		case fw.Addr.IsValid():
			addrs = []netip.Addr{fw.Addr}
		default:
			if !fam.Disable4 {
				addrs = append(addrs, netip.IPv4Unspecified())
			}
			if !fam.Disable6 {
				addrs = append(addrs, netip.IPv6Unspecified())
			}
		}
		for _, addr := range addrs {
			twin := addr.Is6() && !fw.Addr.IsValid() && !fam.Disable4
			for p := int(fw.Host.First); p <= int(fw.Host.Last); p++ {
				out = append(out, tcpstack.Forward{HostAddr: addr, HostPort: uint16(p),
					GuestPort: uint16(int(fw.Guest) + p - int(fw.Host.First)), Iface: fw.Iface,
					Optional: bestEffort || twin})
			}
		}
	}
	return out
}

// MaxPorts bounds the ports one request adds or removes: each is a
// listening socket (two without a bind address), and a daemon's
// descriptors are for its flows.
const MaxPorts = 1024

// errSpec marks an error in a request's spec (400).
var errSpec = errors.New("bad spec")

// parseSpec parses a request's spec: passt's -t/-u syntax with explicit
// ports, at most MaxPorts of them.
func parseSpec(spec string) ([]portspec.Forward, error) {
	sp, err := portspec.Parse(strings.TrimSpace(spec))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errSpec, err)
	}
	if sp.Mode != portspec.ModePorts || sp.ExcludeOnly() {
		return nil, fmt.Errorf("%w %q: give explicit ports (22, 8000-8010, 2222:22, ADDR/22, %%IF/22); all, none, auto and exclusion-only specs are for the command line",
			errSpec, spec)
	}
	var set portspec.Set
	if err := set.Add(strings.TrimSpace(spec)); err != nil {
		return nil, fmt.Errorf("%w: %w", errSpec, err)
	}
	fws := set.Forwards(portspec.DefaultEphemeral) // no "all": the range is not used
	n := 0
	for _, fw := range fws {
		n += fw.Host.Len()
	}
	if n == 0 {
		return nil, fmt.Errorf("%w %q: every port is excluded", errSpec, spec)
	}
	if n > MaxPorts {
		return nil, fmt.Errorf("%w %q: %d ports, at most %d a request", errSpec, spec, n, MaxPorts)
	}
	return fws, nil
}

// parseRemoveSpec parses the spec of a removal: host ports only, as they
// were forwarded (a bind address and interface when the forward had them).
func parseRemoveSpec(spec string) ([]portspec.Forward, error) {
	fws, err := parseSpec(spec)
	if err != nil {
		return nil, err
	}
	sp, _ := portspec.Parse(strings.TrimSpace(spec))
	for _, m := range sp.Ports {
		if m.Guest != m.Host.First {
			return nil, fmt.Errorf("%w %q: a removal names host ports only (8080, not 8080:80)", errSpec, spec)
		}
	}
	return fws, nil
}

// matchForwards finds, for each host port of fws, the open forwards of
// proto it names: the same port and interface, and the bind address given
// or, without one, the wildcard addresses a spec without one opened. Every
// port must match at least one forward.
func matchForwards(open []tcpstack.ForwardInfo, proto string, fws []portspec.Forward) ([]tcpstack.ForwardInfo, error) {
	var out []tcpstack.ForwardInfo
	for _, fw := range fws {
		for p := int(fw.Host.First); p <= int(fw.Host.Last); p++ {
			found := false
			for _, o := range open {
				if o.Proto.String() != proto || int(o.HostPort) != p || o.Iface != fw.Iface {
					continue
				}
				if fw.Addr.IsValid() && o.HostAddr != fw.Addr || !fw.Addr.IsValid() && !o.HostAddr.IsUnspecified() {
					continue
				}
				out = append(out, o)
				found = true
			}
			if !found {
				where := fmt.Sprint(p)
				if fw.Addr.IsValid() {
					where = netip.AddrPortFrom(fw.Addr, uint16(p)).String()
				}
				if fw.Iface != "" {
					where += " on " + fw.Iface
				}
				return nil, fmt.Errorf("%s port %s: %w", proto, where, tcpstack.ErrNoForward)
			}
		}
	}
	return out, nil
}

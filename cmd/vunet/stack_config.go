package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"vunet/cmd/vunet/portspec"
	"vunet/tcpstack"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/tcp"
)

// stackConfig is everything the data plane is built from, with the notes
// the start-up log line reports (fallbacks, options accepted but not yet
// enforced).
type stackConfig struct {
	cfg         tcpstack.Config
	tcpForwards []portspec.Forward
	udpForwards []portspec.Forward
	notes       []string
	warnings    []string
}

// hostDefaults is linksvc.DetectHostDefaults, replaceable in tests so they
// do not depend on the machine's routes.
var hostDefaults = linksvc.DetectHostDefaults

// interfaceAddrs returns the addresses of a host interface; replaceable in
// tests.
var interfaceAddrs = func(name string) ([]netip.Prefix, error) {
	ifi, err := net.InterfaceByName(name)
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
			ip, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			ones, _ := n.Mask.Size()
			out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
		}
	}
	return out, nil
}

// ephemeralPorts reads the kernel's local port range, which "all" and
// exclusion-only port specifications leave alone.
func ephemeralPorts() portspec.Range {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return portspec.DefaultEphemeral
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return portspec.DefaultEphemeral
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || lo < 1 || hi > 65535 || lo > hi {
		return portspec.DefaultEphemeral
	}
	return portspec.Range{First: uint16(lo), Last: uint16(hi)}
}

// buildStackConfig turns the options into the data plane's configuration:
// host defaults first (the default-route interface's addresses, gateway
// and resolvers, like passt), then every option given on top.
func buildStackConfig(o *options) (*stackConfig, error) {
	sc := &stackConfig{warnings: append([]string(nil), o.warnings...)}
	addr, note, err := hostDefaults()
	if err != nil {
		return nil, fmt.Errorf("detect host defaults: %w", err)
	}
	if note != "" {
		sc.notes = append(sc.notes, note)
	}
	linkLocalFallback := strings.Contains(note, "no default route")

	if o.iface != "" {
		if err := applyInterface(o.iface, &addr, sc); err != nil {
			return nil, err
		}
	}
	if o.addr4.IsValid() {
		if addr.Disable4 || linkLocalFallback {
			addr.IPv4.Gateway = netip.Addr{}
		}
		addr.Disable4 = false
		if !addr.Prefix4().IsValid() || !addr.Prefix4().Contains(o.addr4) {
			addr.IPv4.PrefixLen = classfulPrefix(o.addr4)
		}
		addr.IPv4.Addr = o.addr4
	}
	if o.prefix4 >= 0 {
		addr.IPv4.PrefixLen = o.prefix4
	}
	if o.gw4.IsValid() {
		addr.IPv4.Gateway = o.gw4
	}
	if o.addr4.IsValid() && !addr.IPv4.Gateway.IsValid() {
		return nil, fmt.Errorf("--address %v: no IPv4 gateway known for it; give --gateway", o.addr4)
	}
	if addr.IPv4.Gateway.IsValid() && addr.IPv4.Gateway == addr.IPv4.Addr && !addr.Disable4 {
		return nil, fmt.Errorf("--gateway %v is the guest's own address", addr.IPv4.Gateway)
	}
	if o.addr6.IsValid() {
		addr.Disable6 = false
		if addr.IPv6.PrefixLen == 0 || !addr.Prefix6().Contains(o.addr6) {
			addr.IPv6.PrefixLen = 64
		}
		addr.IPv6.Addr = o.addr6
	}
	if o.prefix6 >= 0 {
		addr.IPv6.PrefixLen = o.prefix6
	}
	if o.gw6.IsValid() {
		addr.Disable6 = false
		if o.gw6.IsLinkLocalUnicast() {
			addr.IPv6.GatewayLL = o.gw6
		}
		addr.IPv6.Gateway = o.gw6
	}
	if o.only4 {
		addr.Disable6 = true
	}
	if o.only6 {
		addr.Disable4 = true
	}
	if addr.Disable4 && addr.Disable6 {
		return nil, errors.New("both address families are disabled: nothing to serve (check -4/-6 and the host's routes)")
	}
	if o.ourMAC.ok {
		addr.OurMAC = o.ourMAC.mac
	}
	if o.guestMAC.ok {
		addr.GuestMAC = o.guestMAC.mac
	}
	switch {
	case o.mtu > 0:
		addr.MTU = o.mtu
	case o.mtu == 0:
		sc.warnings = append(sc.warnings, "--mtu 0: not assigning an MTU is not supported; announcing the default")
	}

	switch {
	case o.dnsNone:
		addr.DNS4, addr.DNS6 = nil, nil
	case len(o.dns) > 0:
		addr.DNS4, addr.DNS6 = nil, nil
		for _, a := range o.dns {
			if a.Is4() {
				addr.DNS4 = append(addr.DNS4, a)
			} else {
				addr.DNS6 = append(addr.DNS6, a)
			}
		}
	}
	if err := applyDNSForward(o, &addr, sc); err != nil {
		return nil, err
	}
	// --no-map-gw drops only the default mapping: an explicit
	// --map-host-loopback ADDR maps anyway (passt's rule). vunet maps the
	// gateway only; another address maps nothing, and in passt the
	// gateway would not be mapped then either.
	noMap := o.mapHostLoopbackNone || o.noMapGW && o.mapHostLoopback == ""
	var noMap4, noMap6 bool
	if o.mapHostLoopback != "" && !o.mapHostLoopbackNone {
		a, _ := parseAddr(o.mapHostLoopback)
		switch {
		case a != addr.IPv4.Gateway && a != addr.IPv6.Gateway && a != addr.RouterLL():
			sc.warnings = append(sc.warnings, fmt.Sprintf("--map-host-loopback %v accepted but not supported: vunet maps only the gateway address (%v, %v) to the host's loopback; nothing is mapped",
				a, addr.IPv4.Gateway, addr.RouterLL()))
			noMap = true
		case o.noMapGW:
			// passt's option sets one family's address; --no-map-gw
			// leaves the other family's unmapped.
			noMap4, noMap6 = !a.Is4(), a.Is4()
		}
	}
	dropImplicitLoopbackDNS(o, &addr, sc, noMap || noMap4, noMap || noMap6)
	switch {
	case o.searchNone:
		addr.Search = nil
	case len(o.search) > 0:
		addr.Search = append([]string(nil), o.search...)
	}
	// passt's --no-dhcp-dns and --no-dhcp-search: the guest is told no
	// resolvers, respectively no search list; DNS forwarding still works
	// for a guest configured by other means.
	if o.noDHCPDNS {
		addr.DNS4, addr.DNS6 = nil, nil
	}
	if o.noDHCPSearch {
		addr.Search = nil
	}
	addr.NoDHCP = addr.NoDHCP || o.noDHCP
	addr.NoDHCPv6 = addr.NoDHCPv6 || o.noDHCPv6
	addr.NoNDP = addr.NoNDP || o.noNDP
	addr.NoRA = addr.NoRA || o.noRA
	addr.Hostname, addr.FQDN = o.hostname, o.fqdn

	if err := addr.Validate(); err != nil {
		return nil, fmt.Errorf("guest addressing: %w", err)
	}

	sc.cfg = tcpstack.Config{
		Addr:          addr,
		NoMapGateway:  noMap,
		NoMapGateway4: noMap4,
		NoMapGateway6: noMap6,
		MaxFlows:      o.maxFlows,
		UDPTimeout:    o.udpTimeout,
		ICMPTimeout:   o.icmpTimeout,
		NoTCP:         o.noTCP,
		NoUDP:         o.noUDP,
		NoICMP:        o.noICMP,
		Outbound4:     o.outbound4,
		Outbound6:     o.outbound6,
		TCP: tcp.Config{
			MaxFlows:    o.maxTCPFlows,
			IdleTimeout: o.tcpIdleTimeout,
			SndBuf:      o.tcpSndBuf,
			RcvBuf:      o.tcpRcvBuf,
		},
	}

	eph := ephemeralPorts()
	sc.tcpForwards = o.tcpPorts.Forwards(eph)
	sc.udpForwards = o.udpPorts.Forwards(eph)
	if o.tcpPorts.Mode == portspec.ModeAuto || o.udpPorts.Mode == portspec.ModeAuto {
		sc.notes = append(sc.notes, "port spec auto: follows a namespace's listeners in pasta; vhost-user has none, nothing forwarded")
	}

	return sc, nil
}

// applyInterface replaces the detected addresses with those of interface
// name (passt's -i). The detected gateway stays when it is on the
// interface's prefix; otherwise the first address of the prefix stands in,
// as tcpstack does for a default route without a gateway.
func applyInterface(name string, addr *linksvc.AddrConfig, sc *stackConfig) error {
	prefixes, err := interfaceAddrs(name)
	if err != nil {
		return fmt.Errorf("--interface %s: %w", name, err)
	}
	var p4, p6 netip.Prefix
	for _, p := range prefixes {
		a := p.Addr()
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() {
			continue
		}
		if a.Is4() && !p4.IsValid() {
			p4 = p
		}
		if a.Is6() && !p6.IsValid() {
			p6 = p
		}
	}
	if !p4.IsValid() && !p6.IsValid() {
		return fmt.Errorf("--interface %s: no usable address", name)
	}
	if p4.IsValid() {
		gw := addr.IPv4.Gateway
		if !gw.IsValid() || !p4.Masked().Contains(gw) || gw == p4.Addr() {
			gw = p4.Masked().Addr().Next()
			if gw == p4.Addr() {
				gw = gw.Next()
			}
			sc.notes = append(sc.notes, fmt.Sprintf("interface %s: default gateway not on %v, using %v", name, p4.Masked(), gw))
		}
		addr.IPv4 = linksvc.IPv4Config{Addr: p4.Addr(), PrefixLen: p4.Bits(), Gateway: gw}
		addr.Disable4 = false
	} else {
		addr.Disable4 = true
	}
	if p6.IsValid() {
		addr.IPv6.Addr, addr.IPv6.PrefixLen = p6.Addr(), p6.Bits()
		addr.Disable6 = false
	} else {
		addr.Disable6 = true
	}
	return nil
}

// applyDNSForward maps passt's --dns-forward/--dns-host onto tcpstack's
// DNS forwarding, which works through the gateway address only: guest DNS
// to the gateway goes to the host resolver. A forward at another address
// is named in a start-up warning and left out (the guest is not told of a
// resolver there that would not answer).
func applyDNSForward(o *options, addr *linksvc.AddrConfig, sc *stackConfig) error {
	unsupported := func(a, gw netip.Addr) {
		sc.warnings = append(sc.warnings, fmt.Sprintf("--dns-forward %v accepted but not supported: vunet forwards guest DNS only at the gateway address (%v)", a, gw))
	}
	fwd4, fwd6 := o.dnsForward4.IsValid() && !addr.Disable4, o.dnsForward6.IsValid() && !addr.Disable6
	if fwd4 && o.dnsForward4 != addr.IPv4.Gateway {
		unsupported(o.dnsForward4, addr.IPv4.Gateway)
		fwd4 = false
	}
	if fwd6 && o.dnsForward6 != addr.RouterLL() && o.dnsForward6 != addr.IPv6.Gateway {
		unsupported(o.dnsForward6, addr.RouterLL())
		fwd6 = false
	}
	if fwd4 {
		host := o.dnsHost4
		if !host.IsValid() {
			host = addr.DNSForward4
		}
		if !host.IsValid() {
			for _, a := range addr.DNS4 {
				if a != addr.IPv4.Gateway {
					host = a
					break
				}
			}
		}
		if !host.IsValid() {
			return fmt.Errorf("--dns-forward %v: no host resolver known; give --dns-host", o.dnsForward4)
		}
		addr.DNSForward4 = host
		if !containsAddr(addr.DNS4, o.dnsForward4) {
			addr.DNS4 = append([]netip.Addr{o.dnsForward4}, addr.DNS4...)
		}
	} else if o.dnsHost4.IsValid() {
		addr.DNSForward4 = o.dnsHost4
	}
	if fwd6 {
		host := o.dnsHost6
		if !host.IsValid() {
			host = addr.DNSForward6
		}
		if !host.IsValid() {
			for _, a := range addr.DNS6 {
				if a != o.dnsForward6 {
					host = a
					break
				}
			}
		}
		if !host.IsValid() {
			return fmt.Errorf("--dns-forward %v: no host resolver known; give --dns-host", o.dnsForward6)
		}
		addr.DNSForward6 = host
		if !containsAddr(addr.DNS6, o.dnsForward6) {
			addr.DNS6 = append([]netip.Addr{o.dnsForward6}, addr.DNS6...)
		}
	} else if o.dnsHost6.IsValid() {
		addr.DNSForward6 = o.dnsHost6
	}
	return nil
}

// dropImplicitLoopbackDNS withdraws, for each family whose gateway
// mapping is off, a DNS forward to a host loopback resolver that only
// /etc/resolv.conf asked for: with the mapping off the guest reaches
// nothing on the host's loopback, and only an explicit --dns-forward or
// --dns-host keeps such a forward (passt, too, skips loopback resolvers
// with --no-map-gw). The gateway that stood for
// the resolver leaves the guest's DNS list unless --dns named it.
func dropImplicitLoopbackDNS(o *options, addr *linksvc.AddrConfig, sc *stackConfig, unmapped4, unmapped6 bool) {
	userDNS := len(o.dns) > 0 || o.dnsNone
	if unmapped4 && !o.dnsForward4.IsValid() && !o.dnsHost4.IsValid() && addr.DNSForward4.IsLoopback() {
		sc.notes = append(sc.notes, fmt.Sprintf("host resolver %v is on the host's loopback, out of the guest's reach with the gateway mapping off: not forwarded (give --dns-forward to forward it)", addr.DNSForward4))
		if !userDNS {
			addr.DNS4 = withoutAddr(addr.DNS4, addr.IPv4.Gateway)
		}
		addr.DNSForward4 = netip.Addr{}
	}
	if unmapped6 && !o.dnsForward6.IsValid() && !o.dnsHost6.IsValid() && addr.DNSForward6.IsLoopback() {
		sc.notes = append(sc.notes, fmt.Sprintf("host resolver %v is on the host's loopback, out of the guest's reach with the gateway mapping off: not forwarded (give --dns-forward to forward it)", addr.DNSForward6))
		if !userDNS {
			addr.DNS6 = withoutAddr(addr.DNS6, addr.RouterLL())
		}
		addr.DNSForward6 = netip.Addr{}
	}
}

func withoutAddr(list []netip.Addr, a netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, x := range list {
		if x != a {
			out = append(out, x)
		}
	}
	return out
}

func containsAddr(list []netip.Addr, a netip.Addr) bool {
	for _, x := range list {
		if x == a {
			return true
		}
	}
	return false
}

// classfulPrefix is passt's netmask for an address not found on the host:
// the historic class of the address (RFC 4632 section 3.1).
func classfulPrefix(a netip.Addr) int {
	b := a.As4()[0]
	switch {
	case b < 128:
		return 8
	case b < 192:
		return 16
	default:
		return 24
	}
}

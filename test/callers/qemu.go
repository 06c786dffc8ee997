package callers

import (
	"strconv"
	"strings"
)

// QEMUPasst is QEMU's -netdev passt,… properties (qapi NetDevPasstOptions,
// since 10.1). A nil *bool is a property not given; a string "" likewise.
type QEMUPasst struct {
	Path      string // path=: the program (default "passt")
	Quiet     *bool  // quiet= (default on: --quiet)
	VhostUser bool   // vhost-user=on
	MTU       int    // mtu= (0: not given)
	Address, Netmask, MAC, Gateway, Interface,
	Outbound, OutboundIf4, OutboundIf6, DNS, FQDN string
	DHCPDNS, DHCPSearch                                *bool // dhcp-dns=off → --no-dhcp-dns …
	MapHostLoopback, MapGuestAddr, DNSForward, DNSHost string
	TCP, UDP, ICMP, DHCP, NDP, DHCPv6, RA              *bool // =off → --no-…
	Freebind                                           *bool // =on → --freebind
	IPv4, IPv6                                         *bool // ipv4=off → --ipv6-only …
	Search                                             []string
	TCPPorts, UDPPorts                                 []string
	Param                                              []string // param=…, appended verbatim
}

// Bool returns a pointer to b, for the optional properties.
func Bool(b bool) *bool { return &b }

func off(p *bool) bool { return p != nil && !*p }
func on(p *bool) bool  { return p != nil && *p }

// QEMU101 is QEMU 10.1's net_passt_decode_args: the command line for p,
// with the pid file QEMU created (g_file_open_tmp) and the socket on
// descriptor 3.
func QEMU101(p QEMUPasst, pidFile string) []string {
	path := p.Path
	if path == "" {
		path = "passt"
	}
	args := []string{path}
	if p.VhostUser {
		args = append(args, "--vhost-user")
	}
	if p.Quiet == nil || *p.Quiet {
		args = append(args, "--quiet")
	}
	if p.MTU != 0 {
		args = append(args, "--mtu", strconv.Itoa(p.MTU))
	}
	for _, o := range []struct{ flag, v string }{
		{"--address", p.Address}, {"--netmask", p.Netmask}, {"--mac-addr", p.MAC},
		{"--gateway", p.Gateway}, {"--interface", p.Interface}, {"--outbound", p.Outbound},
		{"--outbound-if4", p.OutboundIf4}, {"--outbound-if6", p.OutboundIf6},
		{"--dns", p.DNS}, {"--fqdn", p.FQDN},
	} {
		if o.v != "" {
			args = append(args, o.flag, o.v)
		}
	}
	if off(p.DHCPDNS) {
		args = append(args, "--no-dhcp-dns")
	}
	if off(p.DHCPSearch) {
		args = append(args, "--no-dhcp-search")
	}
	for _, o := range []struct{ flag, v string }{
		{"--map-host-loopback", p.MapHostLoopback}, {"--map-guest-addr", p.MapGuestAddr},
		{"--dns-forward", p.DNSForward}, {"--dns-host", p.DNSHost},
	} {
		if o.v != "" {
			args = append(args, o.flag, o.v)
		}
	}
	for _, o := range []struct {
		flag string
		v    *bool
	}{
		{"--no-tcp", p.TCP}, {"--no-udp", p.UDP}, {"--no-icmp", p.ICMP}, {"--no-dhcp", p.DHCP},
		{"--no-ndp", p.NDP}, {"--no-dhcpv6", p.DHCPv6}, {"--no-ra", p.RA},
	} {
		if off(o.v) {
			args = append(args, o.flag)
		}
	}
	if on(p.Freebind) {
		args = append(args, "--freebind")
	}
	if off(p.IPv4) {
		args = append(args, "--ipv6-only")
	}
	if off(p.IPv6) {
		args = append(args, "--ipv4-only")
	}
	if len(p.Search) > 0 {
		args = append(args, "--search", strings.Join(p.Search, " "))
	}
	if len(p.TCPPorts) > 0 {
		args = append(args, "--tcp-ports", strings.Join(p.TCPPorts, ","))
	}
	if len(p.UDPPorts) > 0 {
		args = append(args, "--udp-ports", strings.Join(p.UDPPorts, ","))
	}
	args = append(args, p.Param...)
	return append(args, "--pid", pidFile, "--fd", "3")
}

package linksvc

import (
	"fmt"
	"net/netip"

	"vunet/tcpstack/header"
)

// DefaultOurMAC is the stack's own MAC address unless configured, the one
// passt uses, so guests configured for passt see the same neighbour.
var DefaultOurMAC = header.MAC{0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55}

// DefaultMTU is the guest MTU unless configured, as in passt.
const DefaultMTU = 65520

// AddrConfig is what the guest is told about its link: its addresses, the
// gateway it routes through (us), resolvers and MTU. It is read by the link
// services (ARP, DHCP, DHCPv6, NDP) and must not change while a queue pair
// runs; the services copy nothing out of it, so replace the whole value
// between runs rather than editing it in place.
type AddrConfig struct {
	// OurMAC is the MAC address we answer with for the gateway and every
	// other address on the link, like passt's 9a:55:9a:55:9a:55.
	OurMAC header.MAC
	// GuestMAC is the guest's MAC when configured; zero means unknown (the
	// services then reply to the source MAC of each request).
	GuestMAC header.MAC

	IPv4 IPv4Config
	IPv6 IPv6Config

	// DNS4 and DNS6 are the resolvers handed out by DHCP, DHCPv6 and RA.
	DNS4, DNS6 []netip.Addr
	// DNSForward4 and DNSForward6, when valid, are host loopback resolvers
	// (such as systemd-resolved's 127.0.0.53) that the guest cannot reach
	// directly: DNS4/DNS6 then name the gateway instead, and the data path
	// should send the guest's DNS traffic for the gateway to these.
	DNSForward4, DNSForward6 netip.Addr
	// Search is the DNS search list (DHCP option 119, DHCPv6 24, DNSSL).
	Search []string
	// MTU is the guest MTU announced by DHCP (option 26) and RA; 0 means
	// DefaultMTU.
	MTU int
	// Hostname, when set, is the guest's host name (DHCP option 12).
	Hostname string
	// FQDN, when set, is the guest's fully qualified domain name (DHCP
	// option 81, DHCPv6 option 39).
	FQDN string

	// NoDHCP disables the DHCPv4 server.
	NoDHCP bool
	// NoDHCPv6 disables the DHCPv6 server.
	NoDHCPv6 bool
	// NoNDP disables all NDP answers (neighbor and router advertisements).
	NoNDP bool
	// NoRA disables router advertisements only.
	NoRA bool
	// Disable4 and Disable6 turn a whole address family off: no ARP/DHCP,
	// respectively no NDP/DHCPv6 answers.
	Disable4, Disable6 bool
}

// IPv4Config is the guest's IPv4 configuration.
type IPv4Config struct {
	// Addr is the address given to the guest (by default the host's own).
	Addr netip.Addr
	// PrefixLen is the on-link prefix length.
	PrefixLen int
	// Gateway is the default router address we impersonate.
	Gateway netip.Addr
}

// IPv6Config is the guest's IPv6 configuration.
type IPv6Config struct {
	// Addr is the global address given to the guest by DHCPv6 (and whose
	// prefix SLAAC uses); invalid means link-local only.
	Addr netip.Addr
	// PrefixLen is the length of the advertised prefix.
	PrefixLen int
	// Gateway is the host's default router, which may itself be link-local.
	Gateway netip.Addr
	// GatewayLL is the link-local address we send RAs, NAs and DHCPv6
	// replies from, and which the guest uses as its default router.
	GatewayLL netip.Addr
}

// DefaultGatewayLL is the link-local address we answer as when the host's
// router is not link-local itself.
var DefaultGatewayLL = netip.MustParseAddr("fe80::1")

// Link-local fallback used when the host has no default route, as passt's
// "local mode": the guest still gets a usable link to us.
var (
	fallbackGuest4   = netip.MustParseAddr("169.254.2.1")
	fallbackGateway4 = netip.MustParseAddr("169.254.2.2")
)

const fallbackPrefixLen4 = 16

// Prefix4 returns the guest's on-link IPv4 prefix, masked (invalid when
// unset).
func (c *AddrConfig) Prefix4() netip.Prefix {
	p, err := c.IPv4.Addr.Prefix(c.IPv4.PrefixLen)
	if err != nil {
		return netip.Prefix{}
	}
	return p
}

// Prefix6 returns the guest's IPv6 prefix, masked (invalid when unset).
func (c *AddrConfig) Prefix6() netip.Prefix {
	p, err := c.IPv6.Addr.Prefix(c.IPv6.PrefixLen)
	if err != nil {
		return netip.Prefix{}
	}
	return p
}

// EffectiveMTU returns MTU, or DefaultMTU when unset.
func (c *AddrConfig) EffectiveMTU() int {
	if c.MTU <= 0 {
		return DefaultMTU
	}
	return c.MTU
}

// RouterLL returns the link-local address our IPv6 messages come from.
func (c *AddrConfig) RouterLL() netip.Addr {
	if c.IPv6.GatewayLL.Is6() && c.IPv6.GatewayLL.IsLinkLocalUnicast() {
		return c.IPv6.GatewayLL
	}
	return DefaultGatewayLL
}

// Validate checks the fields the services rely on and returns the first
// problem found.
func (c *AddrConfig) Validate() error {
	if c.OurMAC.IsZero() || c.OurMAC.IsMulticast() {
		return fmt.Errorf("our MAC %v: must be a unicast address", c.OurMAC)
	}
	if !c.Disable4 {
		if !c.IPv4.Addr.Is4() {
			return fmt.Errorf("ipv4 address %v: not an IPv4 address", c.IPv4.Addr)
		}
		if c.IPv4.PrefixLen < 1 || c.IPv4.PrefixLen > 32 {
			return fmt.Errorf("ipv4 prefix length %d: out of range", c.IPv4.PrefixLen)
		}
		if c.IPv4.Gateway.IsValid() && !c.IPv4.Gateway.Is4() {
			return fmt.Errorf("ipv4 gateway %v: not an IPv4 address", c.IPv4.Gateway)
		}
	}
	if !c.Disable6 {
		if c.IPv6.Addr.IsValid() && (!c.IPv6.Addr.Is6() || c.IPv6.Addr.Is4In6()) {
			return fmt.Errorf("ipv6 address %v: not an IPv6 address", c.IPv6.Addr)
		}
		if c.IPv6.Addr.IsValid() && (c.IPv6.PrefixLen < 1 || c.IPv6.PrefixLen > 128) {
			return fmt.Errorf("ipv6 prefix length %d: out of range", c.IPv6.PrefixLen)
		}
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
		return fmt.Errorf("mtu %d: outside 68..65535", c.MTU)
	}
	return c.validateNames()
}

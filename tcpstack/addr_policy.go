package tcpstack

import (
	"net/netip"

	"vunet/tcpstack/addrpolicy"
)

// newAddrPolicy builds the address policy (package addrpolicy) from the
// Stack's configuration: the guest's addresses and prefixes, its gateways,
// the gateway mapping and the DNS forward.
func newAddrPolicy(cfg *Config) *addrpolicy.Policy {
	a := &cfg.Addr
	pc := addrpolicy.Config{
		Gateway4:    a.IPv4.Gateway,
		MapGateway:  !cfg.NoMapGateway,
		DNSForward4: a.DNSForward4,
		DNSForward6: a.DNSForward6,
	}
	if !a.Disable4 && a.IPv4.Addr.IsValid() {
		pc.Guest4 = netip.PrefixFrom(a.IPv4.Addr, a.IPv4.PrefixLen)
	}
	if !a.Disable6 {
		pc.LinkLocal6 = true
		pc.Gateway6 = a.RouterLL()
		pc.Gateway6Global = a.IPv6.Gateway
		if a.IPv6.Addr.IsValid() {
			pc.Guest6 = netip.PrefixFrom(a.IPv6.Addr, a.IPv6.PrefixLen)
		}
	}
	return addrpolicy.New(pc)
}

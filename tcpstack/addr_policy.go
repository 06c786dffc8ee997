package tcpstack

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/stats"
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

// policyLogInterval is the least time between two policy drop lines of one
// table; the lines in between are counted and reported with the next one.
const policyLogInterval = time.Second

// policyGate is where a flow table asks the address policy before opening
// a host socket, and where refusals are counted (stats.Queue.PolicyDrops and
// the TX drops as stats.DropPolicy) and logged at a rate limit.
type policyGate struct {
	pol      *addrpolicy.Policy
	st       *stats.Queue
	log      *slog.Logger
	logLimit stats.Limiter // drop lines
}

// outbound returns the policy's verdict on a guest flow of proto from src to
// dst, counting and logging a refusal.
func (g *policyGate) outbound(now time.Time, proto addrpolicy.Proto, src netip.Addr, dst netip.AddrPort) addrpolicy.Verdict {
	v := g.pol.Outbound(proto, src, dst)
	if v.Allowed() {
		return v
	}
	g.st.PolicyDrops[proto][v.Reason].Add(1)
	g.st.TX.Drops[stats.DropPolicy].Add(1)
	level := slog.LevelWarn
	if v.Reason.Routine() {
		level = slog.LevelDebug
	}
	if !g.log.Enabled(context.Background(), level) {
		return v
	}
	ok, suppressed := g.logLimit.Allow(now, policyLogInterval)
	if !ok {
		return v
	}
	g.log.Log(context.Background(), level, "guest packet refused by the address policy",
		"reason", v.Reason.String(), "proto", proto.String(), "src", src, "dst", dst,
		"suppressed", suppressed)
	return v
}

package stats

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"vunet/tcpstack/addrpolicy"
)

// PolicyLogInterval is the least time between two policy drop lines of one
// gate; the lines in between are counted and reported with the next one.
const PolicyLogInterval = time.Second

// PolicyGate is where TCP and the datagram flows ask the address policy
// before they open a host socket for the guest, and where a refusal is
// recorded: counted in Queue.PolicyDrops and as a TX drop (DropPolicy),
// and logged at a rate limit. The decision is the policy's; the gate only
// keeps the books. One gate belongs to one loop goroutine.
type PolicyGate struct {
	Policy *addrpolicy.Policy
	Stats  *Queue
	Log    *slog.Logger

	logLimit Limiter
}

// Outbound returns the policy's verdict on a guest flow of proto from src
// to dst, recording a refusal.
func (g *PolicyGate) Outbound(now time.Time, proto addrpolicy.Proto, src netip.Addr, dst netip.AddrPort) addrpolicy.Verdict {
	v := g.Policy.Outbound(proto, src, dst)
	if v.Allowed() {
		return v
	}
	g.Stats.PolicyDrops[proto][v.Reason].Add(1)
	g.Stats.TX.Drops[DropPolicy].Add(1)
	level := slog.LevelWarn
	if v.Reason.Routine() {
		level = slog.LevelDebug
	}
	if !g.Log.Enabled(context.Background(), level) {
		return v
	}
	ok, suppressed := g.logLimit.Allow(now, PolicyLogInterval)
	if !ok {
		return v
	}
	g.Log.Log(context.Background(), level, "guest packet refused by the address policy",
		"reason", v.Reason.String(), "proto", proto.String(), "src", src, "dst", dst,
		"suppressed", suppressed)
	return v
}

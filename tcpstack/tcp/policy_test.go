package tcp

import (
	"context"
	"log/slog"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
)

// loopbackSpellings are the ways a guest can write a host loopback address
// in an IPv4 or IPv6 header.
var loopbackSpellings = []string{
	"127.0.0.1", "127.9.9.9", "::1",
	"::ffff:127.0.0.1", "::ffff:127.9.9.9", "::127.0.0.1", "::127.9.9.9",
	// Through a translator or tunnel on the host: NAT64, 6to4, Teredo.
	"64:ff9b::7f00:1", "2002:7f00:1::1", "2001:0:7f00:1::1",
}

// TestPolicyTCPDNSForward: DNS over TCP to the gateway goes to the DNS
// forward's resolver, mapping on or off, as UDP does; other gateway ports
// follow the mapping.
func TestPolicyTCPDNSForward(t *testing.T) {
	for _, mapGW := range []bool{true, false} {
		h := tcpNewHarness(t, Config{})
		pc := tcpHarnessPolicy
		pc.MapGateway = mapGW
		pc.DNSForward4 = netip.MustParseAddr("127.0.0.53")
		pc.DNSForward6 = netip.MustParseAddr("::1")
		h.tab.policy.Policy = addrpolicy.New(pc)
		var dialed []netip.AddrPort
		h.tab.dial = func(dst netip.AddrPort, _, _ int) (int, bool, error) {
			dialed = append(dialed, dst)
			return -1, false, unix.ECONNREFUSED
		}
		cases := []struct{ guest, remote, want string }{
			{"10.0.2.15:40000", "10.0.2.2:53", "127.0.0.53:53"},
			{"[fd00::15]:40000", "[fe80::1]:53", "[::1]:53"},
			{"10.0.2.15:40001", "10.0.2.2:80", map[bool]string{true: "127.0.0.1:80", false: "10.0.2.2:80"}[mapGW]},
		}
		for _, c := range cases {
			dialed = nil
			h.guest, h.remote = netip.MustParseAddrPort(c.guest), netip.MustParseAddrPort(c.remote)
			h.sendSYN(header.TCPOptions{})
			if len(dialed) != 1 || dialed[0] != netip.MustParseAddrPort(c.want) {
				t.Errorf("map=%v: SYN to %s dialed %v, want %s", mapGW, c.remote, dialed, c.want)
			}
		}
	}
}

// TestPolicyTCPRefusedQuietly: a refused SYN or stray segment opens no
// socket and gets no RST (the guest is not told what exists), but is
// counted and logged at a rate limit.
func TestPolicyTCPRefusedQuietly(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	var dialed int
	h.tab.dial = func(netip.AddrPort, int, int) (int, bool, error) {
		dialed++
		return -1, false, unix.ECONNREFUSED
	}
	logged := &countingHandler{}
	h.tab.policy.Log = slog.New(logged)
	for i, s := range loopbackSpellings {
		guest := "10.0.2.15"
		if netip.MustParseAddr(s).Is6() {
			guest = "fd00::15"
		}
		h.guest = netip.AddrPortFrom(netip.MustParseAddr(guest), 40000+uint16(i))
		h.remote = netip.AddrPortFrom(netip.MustParseAddr(s), 80)
		h.sendSYN(header.TCPOptions{})
		h.inject(h.frame(header.TCPFlagACK, 5, 6, 100, nil, []byte("x")))
	}
	if dialed != 0 {
		t.Errorf("%d dials", dialed)
	}
	if segs := h.flush(); len(segs) != 0 {
		t.Errorf("%d segments to the guest, want none", len(segs))
	}
	n := uint64(2 * len(loopbackSpellings))
	if got := h.qstats.PolicyDrops[addrpolicy.TCP][addrpolicy.DstLoopback].Load(); got != n {
		t.Errorf("policy drops = %d, want %d", got, n)
	}
	if logged.n != 1 {
		t.Errorf("%d log lines within a second, want 1", logged.n)
	}
	h.now = h.now.Add(2 * stats.PolicyLogInterval)
	h.sendSYN(header.TCPOptions{})
	if logged.n != 2 || logged.last["suppressed"] != n-1 {
		t.Errorf("after the interval: %d lines, suppressed=%v; want 2, %d", logged.n, logged.last["suppressed"], n-1)
	}
}

// TestPolicyInboundFromLoopbackAndOwnAddress: forwarded connections from
// the host's loopback or from the guest's own address appear from the
// gateway, with the mapping on or off.
func TestPolicyInboundFromLoopbackAndOwnAddress(t *testing.T) {
	for _, mapGW := range []bool{true, false} {
		pc := tcpHarnessPolicy
		pc.MapGateway = mapGW
		pol := addrpolicy.New(pc)
		for _, c := range []struct{ peer, want string }{
			{"127.0.0.1", "10.0.2.2"}, {"::1", "fe80::1"}, {"10.0.2.15", "10.0.2.2"}, {"192.0.2.9", "192.0.2.9"},
		} {
			got, ok := pol.InboundSource(netip.MustParseAddr(c.peer))
			if !ok || got != netip.MustParseAddr(c.want) {
				t.Errorf("map=%v: peer %s appears as %v %v, want %s", mapGW, c.peer, got, ok, c.want)
			}
		}
	}
}

// countingHandler counts log records and keeps the last one's attributes.
type countingHandler struct {
	n    int
	last map[string]any
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.n++
	h.last = map[string]any{}
	r.Attrs(func(a slog.Attr) bool {
		h.last[a.Key] = a.Value.Any()
		return true
	})
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

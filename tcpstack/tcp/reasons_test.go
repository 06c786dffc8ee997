package tcp

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
)

// sumReasons adds up a counter kept by reason.
func sumReasons(c *[stats.NumTCPReasons]atomic.Uint64) uint64 {
	var n uint64
	for i := range c {
		n += c[i].Load()
	}
	return n
}

// reasonCounts renders the non-zero reasons of a counter, for messages.
func reasonCounts(c *[stats.NumTCPReasons]atomic.Uint64) string {
	s := "{"
	for i := range c {
		if n := c[i].Load(); n != 0 {
			s += fmt.Sprintf(" %v=%d", stats.TCPReason(i), n)
		}
	}
	return s + " }"
}

// TestTCPReasonsOfErrors: socket errors map onto the counters' vocabulary,
// and each mapping lands in the reasons its counter exports.
func TestTCPReasonsOfErrors(t *testing.T) {
	for _, c := range []struct {
		err            error
		connect, reset stats.TCPReason
	}{
		{unix.ECONNREFUSED, stats.TCPRefused, stats.TCPHostReset},
		{unix.ECONNRESET, stats.TCPRefused, stats.TCPHostReset},
		{unix.EPIPE, stats.TCPError, stats.TCPHostReset},
		{unix.EHOSTUNREACH, stats.TCPUnreachable, stats.TCPError},
		{unix.ENETUNREACH, stats.TCPUnreachable, stats.TCPError},
		{unix.ETIMEDOUT, stats.TCPTimeout, stats.TCPTimeout},
		{unix.EACCES, stats.TCPError, stats.TCPError},
		{fmt.Errorf("dial: %w", unix.ECONNREFUSED), stats.TCPRefused, stats.TCPHostReset},
		{fmt.Errorf("no errno"), stats.TCPError, stats.TCPError},
	} {
		if got := connectReason(c.err); got != c.connect {
			t.Errorf("connectReason(%v) = %v, want %v", c.err, got, c.connect)
		}
		if got := resetReason(c.err); got != c.reset {
			t.Errorf("resetReason(%v) = %v, want %v", c.err, got, c.reset)
		}
	}
	exported := func(set []stats.TCPReason, r stats.TCPReason) bool {
		for _, x := range set {
			if x == r {
				return true
			}
		}
		return false
	}
	for e := unix.Errno(1); e < 134; e++ {
		if r := connectReason(e); !exported(stats.TCPConnectFailReasons, r) {
			t.Errorf("connect error %v maps to %v, which connect failures do not export", e, r)
		}
		if r := resetReason(e); !exported(stats.TCPResetReasons, r) {
			t.Errorf("reset error %v maps to %v, which resets do not export", e, r)
		}
	}
}

// TestTCPFlowCounters: the pair's TCP flow counters follow the table:
// capacity from MaxFlows, one open and one live flow per connection, the
// close when its slot is released; a session end resets what is left,
// counted by reason, and the live gauge returns to zero.
func TestTCPFlowCounters(t *testing.T) {
	h := tcpNewHarness(t, Config{MaxFlows: 4})
	fl := &h.qstats.Flows
	if c := fl.Capacity[stats.FlowTCP].Load(); c != 4 {
		t.Fatalf("capacity %d, want 4", c)
	}
	ln := h.listen()
	h.establish(ln, tcpMss1400ws7)
	h.guest = netip.MustParseAddrPort("10.0.2.15:40001")
	h.sendSYN(tcpMss1400ws7) // the slot is taken at the SYN
	if o, l := fl.Opened[stats.FlowTCP].Load(), fl.Live[stats.FlowTCP].Load(); o != 2 || l != 2 {
		t.Fatalf("opened %d live %d, want 2 2", o, l)
	}
	h.inject(h.frame(header.TCPFlagRST, h.seq, 0, 0, nil, nil)) // the second one
	if c, l := fl.Closed[stats.FlowTCP].Load(), fl.Live[stats.FlowTCP].Load(); c != 1 || l != 1 {
		t.Fatalf("closed %d live %d after a guest RST, want 1 1", c, l)
	}
	h.tab.ResetConnections()
	if c, l := fl.Closed[stats.FlowTCP].Load(), fl.Live[stats.FlowTCP].Load(); c != 2 || l != 0 {
		t.Fatalf("closed %d live %d after the session end, want 2 0", c, l)
	}
	if h.stats.Resets[stats.TCPSessionEnd].Load() != 1 || h.stats.Resets[stats.TCPGuestRST].Load() != 1 || sumReasons(&h.stats.Resets) != 2 {
		t.Fatalf("resets %v, want guest_rst=1 session_end=1", reasonCounts(&h.stats.Resets))
	}
	if e, u := fl.Evicted[stats.FlowTCP].Load(), fl.Opened[stats.FlowUDP].Load(); e != 0 || u != 0 {
		t.Fatalf("TCP counted as evicted (%d) or as UDP (%d)", e, u)
	}
}

// TestTCPConnectFailurePolicy: a guest SYN the address policy refuses is
// a connect failure (policy), with no connect() attempted; a refused
// non-SYN segment is not.
func TestTCPConnectFailurePolicy(t *testing.T) {
	h := tcpNewHarness(t, Config{})
	h.remote = netip.MustParseAddrPort("127.0.0.1:80") // loopback: refused
	h.sendSYN(tcpMss1400ws7)
	h.inject(h.frame(header.TCPFlagACK, h.seq, 1, h.wnd, nil, nil))
	if n := h.stats.ConnectFailures[stats.TCPPolicy].Load(); n != 1 || sumReasons(&h.stats.ConnectFailures) != 1 {
		t.Fatalf("connect failures %v, want policy=1", reasonCounts(&h.stats.ConnectFailures))
	}
	if h.stats.Connects.Load() != 0 || h.qstats.PolicyDrops[addrpolicy.TCP][addrpolicy.DstLoopback].Load() != 2 {
		t.Fatalf("connects %d policy drops %d", h.stats.Connects.Load(), h.qstats.PolicyDrops[addrpolicy.TCP][addrpolicy.DstLoopback].Load())
	}
}

// TestTCPAcceptRefusedTableFull: a connection to a forwarded port that
// finds every slot taken is refused and counted as table_full.
func TestTCPAcceptRefusedTableFull(t *testing.T) {
	h := tcpNewHarness(t, Config{MaxFlows: 1})
	h.tab.SetGuest(h.guestMAC, h.guest.Addr(), netip.Addr{})
	ln := h.listen()
	h.establish(ln, tcpMss1400ws7)
	h.dialForward(t, 8080)
	deadline := time.Now().Add(5 * time.Second)
	for h.stats.AcceptRefusals[stats.TCPTableFull].Load() == 0 && time.Now().Before(deadline) {
		h.pump(10 * time.Millisecond)
	}
	if n := h.stats.AcceptRefusals[stats.TCPTableFull].Load(); n != 1 || sumReasons(&h.stats.AcceptRefusals) != 1 || h.stats.Accepted.Load() != 0 {
		t.Fatalf("accept refusals %v accepted %d, want table_full=1 and 0", reasonCounts(&h.stats.AcceptRefusals), h.stats.Accepted.Load())
	}
}

// TestTCPDNSForwardConnects: a guest connection to the gateway's port 53
// goes to the DNS forward's resolver and is counted; one to another port
// of the gateway is not.
func TestTCPDNSForwardConnects(t *testing.T) {
	pc := tcpHarnessPolicy
	pc.DNSForward4 = netip.MustParseAddr("127.0.0.1")
	h := tcpNewHarness(t, Config{Policy: addrpolicy.New(pc)})
	h.remote = netip.MustParseAddrPort("10.0.2.2:53")
	h.sendSYN(tcpMss1400ws7)
	h.guest = netip.MustParseAddrPort("10.0.2.15:40001")
	h.remote = netip.MustParseAddrPort("10.0.2.2:80")
	h.sendSYN(tcpMss1400ws7)
	if c, d := h.stats.Connects.Load(), h.stats.DNSForwardConnects.Load(); c != 2 || d != 1 {
		t.Fatalf("connects %d dns forward connects %d, want 2 1", c, d)
	}
}

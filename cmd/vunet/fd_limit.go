package main

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Descriptors the daemon may hold at once: one host socket per flow (the
// flow tables are per queue pair: --max-flows UDP/ICMP and --max-tcp-flows
// TCP each, plus a quarter of --max-flows for the peers of forwarded UDP
// ports on pair 0), one per forwarded port and family, a few per queue pair (its
// event loop's epoll, wake, yield and mailbox eventfds and timer, its
// rings' kick, call and error eventfds) and a fixed overhead (standard streams, the runtime's
// poller, the vhost-user listener and connection, log, pcap and pid files,
// metrics listener and scrapes, the sandbox's keeper).
const (
	fdPerPair  = 11
	fdOverhead = 64
	// minFlowsPerPair is the least a pair is useful with: below it, start-up
	// refuses rather than shrink the default limits further.
	minFlowsPerPair = 64
	// The tables' defaults (tcpstack): 1024 UDP/ICMP, 4096 TCP per pair.
	defaultMaxFlows    = 1024
	defaultMaxTCPFlows = 4096
)

// rlimiter reads and sets RLIMIT_NOFILE (a seam for tests).
type rlimiter interface {
	get() (unix.Rlimit, error)
	set(unix.Rlimit) error
}

type processRlimit struct{}

func (processRlimit) get() (unix.Rlimit, error) {
	var l unix.Rlimit
	err := unix.Getrlimit(unix.RLIMIT_NOFILE, &l)
	return l, err
}

func (processRlimit) set(l unix.Rlimit) error { return unix.Setrlimit(unix.RLIMIT_NOFILE, &l) }

// fitFDLimit checks RLIMIT_NOFILE against what the flow limits, forwards
// and queue pairs may hold open, as passt does at start-up: the soft limit
// is raised toward the hard one (Go raises it to the hard limit at start
// already; this also covers a limit lowered since). When even the hard
// limit is too low, flow limits given on the command line are refused
// with the numbers and the ways out; default ones are lowered to fit, with
// a warning, as long as each pair keeps minFlowsPerPair flows. Without the
// check the daemon would run into EMFILE under load: guest connections
// refused at random instead of at a table limit it counts.
func fitFDLimit(o *options, sc *stackConfig, rl rlimiter) error {
	lim, err := rl.get()
	if err != nil {
		return nil // nothing to check against; the tables still bound flows
	}
	udp, tcp := sc.cfg.MaxFlows, sc.cfg.TCP.MaxFlows
	if udp <= 0 {
		udp = defaultMaxFlows
	}
	if tcp <= 0 {
		tcp = defaultMaxTCPFlows
	}
	fixed := uint64(len(sc.cfg.TCPForwards)+len(sc.cfg.UDPForwards)) + fdOverhead + uint64(o.queues)*fdPerPair
	if len(sc.cfg.UDPForwards) > 0 {
		// The reply sockets of forwarded UDP ports' peers: a quota of their
		// own on pair 0, a quarter of the pair's UDP/ICMP flows
		// (dgram.Config.MaxInboundFlows).
		fixed += uint64(max(udp/4, 1))
	}
	need := fixed + uint64(o.queues)*uint64(udp+tcp)
	if lim.Cur >= need {
		return nil
	}
	if lim.Max >= need || lim.Max == unix.RLIM_INFINITY {
		want := lim
		want.Cur = need
		if err := rl.set(want); err != nil {
			return fmt.Errorf("open-files limit %d is below the %d descriptors the flow limits need, and raising it failed: %w", lim.Cur, need, err)
		}
		return nil
	}
	// The hard limit is too low for the flow limits.
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if err := rl.set(raised); err == nil {
			lim = raised
		}
	}
	explain := fmt.Sprintf("%d queue pair(s) × (%d UDP/ICMP + %d TCP flows + %d) + %d forwarded-port sockets and overhead = %d descriptors",
		o.queues, udp, tcp, fdPerPair, fixed-uint64(o.queues)*fdPerPair, need)
	if o.maxFlows > 0 || o.maxTCPFlows > 0 { // given on the command line
		return fmt.Errorf("open-files limit is %d (hard), below %s: raise it (ulimit -Hn, LimitNOFILE=) or lower --max-tcp-flows, --max-flows or --queues", lim.Max, explain)
	}
	perPair := uint64(0)
	if lim.Cur > fixed {
		perPair = (lim.Cur - fixed) / uint64(o.queues)
	}
	if perPair < minFlowsPerPair {
		return fmt.Errorf("open-files limit is %d (hard), below %s and too low for even %d flows per queue pair: raise it (ulimit -Hn, LimitNOFILE=) or forward fewer ports",
			lim.Max, explain, minFlowsPerPair)
	}
	// Keep the defaults' proportion: one UDP/ICMP flow to four TCP.
	newUDP := int(perPair * defaultMaxFlows / (defaultMaxFlows + defaultMaxTCPFlows))
	newTCP := int(perPair) - newUDP
	sc.cfg.MaxFlows, sc.cfg.TCP.MaxFlows = newUDP, newTCP
	sc.warnings = append(sc.warnings, fmt.Sprintf(
		"open-files limit is %d (hard), below %s: flow limits lowered to %d UDP/ICMP and %d TCP per queue pair (raise the limit, e.g. LimitNOFILE=, for the defaults)",
		lim.Max, explain, newUDP, newTCP))
	return nil
}

package guest

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// KernelArgs are the guest kernel's own parameters, the same for every
// boot of the test guest: serial console, reboot on panic, a quiet boot.
// loglevel=5 lets warnings through to the console: a soft lockup's or an
// RCU stall's backtrace is printed at the default level (4), and without
// it a hung guest shows only the one-line headline. no_timer_check skips
// the kernel's IO-APIC timer check, which under TCG on a loaded host sees
// too few timer ticks and panics with "IO-APIC + timer doesn't work" (seen
// in e2e runs beside other QEMU guests).
const KernelArgs = "console=ttyS0 panic=-1 quiet loglevel=5 no_timer_check"

// Kernel command-line parameters the agent reads. Only "vunet."-prefixed
// words are ours; the kernel ignores unknown dotted parameters.
const (
	ParamChecks    = "vunet.check"     // comma-separated check names, run in order
	ParamTimeout   = "vunet.timeout"   // per-check timeout (Go duration), default DefaultCheckTimeout
	ParamTXFrames  = "vunet.txframes"  // frames the link check transmits, default DefaultTXFrames
	ParamARP       = "vunet.arp"       // IPv4 address the arp check resolves; default: DHCP router
	ParamPing      = "vunet.ping"      // IPv4 address the ping check pings; default: DHCP router
	ParamPingCount = "vunet.pingcount" // echo requests the ping check sends, 10 a second; default 3
	ParamHTTP      = "vunet.http"      // URL the http check fetches
	ParamAddr      = "vunet.addr"      // static IPv4 address/prefix the link check puts on eth0 (no DHCP needed)
	ParamARPLoop   = "vunet.arploop"   // how long the arploop check keeps asking (Go duration), default DefaultARPLoop
	ParamARPFlood  = "vunet.arpflood"  // requests the arpflood check sends, default DefaultARPFlood
	ParamHold      = "vunet.hold"      // keep the guest running this long (Go duration) after the last result, so the host can inspect the back-end
	ParamResults   = "vunet.results"   // extra device for result lines, e.g. /dev/ttyS1
	// ParamSysctl is a comma-separated list of PATH=VALUE the link check
	// writes under /proc/sys once eth0 exists, before it brings eth0 up,
	// e.g. net/ipv6/conf/eth0/router_solicitations=0.
	ParamSysctl = "vunet.sysctl"
)

// Check names the agent knows.
const (
	CheckLink = "link" // eth0 up with carrier, ProbeEtherType frames transmitted and completed by the back-end
	CheckDHCP = "dhcp" // udhcpc got a lease; eth0, default route and resolv.conf configured
	CheckARP  = "arp"  // an ARP request is answered
	CheckPing = "ping" // ICMP echo answered (busybox ping)
	CheckHTTP = "http" // HTTP GET succeeds; reports bytes, sha256 and rate
	// CheckARPLoop sends an ARP request every ARPLoopInterval for the
	// vunet.arploop duration and reports the reply pattern (replies,
	// max_gap_ms, last_reply_ms): a test can restart the back-end meanwhile
	// and see the outage and the recovery.
	CheckARPLoop = "arploop"
	// CheckIPv6 waits for the kernel to configure eth0 from router
	// advertisements (SLAAC): a global address and a default route.
	// Reports addrs (global, space-separated), router and prefixlen.
	CheckIPv6 = "ipv6"
	// CheckARPFlood sends vunet.arpflood ARP requests, each for a different
	// address in ARPFloodBase, with at most ARPFloodWindow unanswered, and
	// counts the answers (sent, replies, unique, pps). Thousands of frames
	// wrap both rings many times over.
	CheckARPFlood = "arpflood"
)

// ProbeEtherType is the ethertype of the link check's frames: IEEE 802's
// "local experimental" type, which no back-end translates or forwards, so
// the probes can only be counted and dropped, never leak onto a host network.
const ProbeEtherType = 0x88B5

// Defaults for the agent's parameters.
const (
	DefaultCheckTimeout = 20 * time.Second
	DefaultTXFrames     = 8
	DefaultARPLoop      = 10 * time.Second
	ARPLoopInterval     = 100 * time.Millisecond
	DefaultARPFlood     = 5000
	ARPFloodWindow      = 32
)

// ARPFloodBase is the first address the arpflood check asks for; request i
// asks for ARPFloodBase + i.
var ARPFloodBase = [4]byte{10, 1, 0, 0}

// Params is the agent's view of the kernel command line.
type Params struct {
	Checks   []string
	Timeout  time.Duration
	TXFrames int
	Values   map[string]string // every vunet.* parameter, raw
}

// ParseCmdline extracts the agent's parameters from /proc/cmdline contents.
func ParseCmdline(cmdline string) (Params, error) {
	p := Params{Timeout: DefaultCheckTimeout, TXFrames: DefaultTXFrames, Values: map[string]string{}}
	for _, w := range strings.Fields(cmdline) {
		k, v, ok := strings.Cut(w, "=")
		if !ok || !strings.HasPrefix(k, "vunet.") {
			continue
		}
		p.Values[k] = v
		switch k {
		case ParamChecks:
			p.Checks = nil
			for _, c := range strings.Split(v, ",") {
				if c != "" {
					p.Checks = append(p.Checks, c)
				}
			}
		case ParamTimeout:
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return p, fmt.Errorf("%s=%q: want a positive duration", k, v)
			}
			p.Timeout = d
		case ParamTXFrames:
			var n int
			if _, err := fmt.Sscanf(v, "%d", &n); err != nil || n < 1 || n > 10000 {
				return p, fmt.Errorf("%s=%q: want 1..10000", k, v)
			}
			p.TXFrames = n
		}
	}
	return p, nil
}

// Cmdline renders kernel command-line words for the given checks and extra
// parameters (keys without the "vunet." prefix are given one).
func Cmdline(checks []string, extra map[string]string) string {
	words := []string{ParamChecks + "=" + strings.Join(checks, ",")}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := k
		if !strings.HasPrefix(name, "vunet.") {
			name = "vunet." + name
		}
		words = append(words, name+"="+extra[k])
	}
	return strings.Join(words, " ")
}

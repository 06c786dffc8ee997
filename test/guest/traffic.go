package guest

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Traffic checks: TCP and UDP through the back-end to servers on the host
// (test/qemu's TrafficServer), and a TCP server in the guest for inbound
// forwarding. Their targets are "host:port" strings where host is a
// literal address or one of the tokens below, resolved in the guest.
const (
	// CheckXferPrefix starts the name of a bulk transfer check:
	// "xfer.<label>" runs the transfer described by parameter
	// "vunet.xfer.<label>" (see XferSpec) and reports dir, bytes, sha256
	// (of what the guest received or sent), peer_sha256 (uploads: what the
	// server says it received), mbps, and target.
	CheckXferPrefix = "xfer."
	// CheckUDPEcho sends UDPEchoSizes datagrams to vunet.udpecho (one at a
	// time, each retried at most UDPEchoTries times) and compares every
	// echo byte for byte: sent, echoed, retries, mismatched.
	CheckUDPEcho = "udpecho"
	// CheckTCPMany opens vunet.tcpmany="target,n" connections to the echo
	// service, holds all of them open at once, then echoes one byte on each:
	// conns, established, echoed, max_open.
	CheckTCPMany = "tcpmany"
	// CheckTCPLoop opens a new echo connection to vunet.tcploop="target,dur"
	// every TCPLoopInterval for dur and reports how many round trips
	// worked and when: tries, ok, max_gap_ms, last_ok_ms, duration_ms.
	CheckTCPLoop = "tcploop"
	// CheckTCPServe listens on port vunet.tcpserve (IPv4 and IPv6), prints
	// the result ResultTCPServeReady once listening, accepts one
	// connection, reads it to EOF, answers "<bytes> <sha256>\n" and
	// reports bytes, sha256 and peer.
	CheckTCPServe = "tcpserve"
	// CheckEchoServe serves TCP and UDP echo on port vunet.echoserve=
	// "port,duration" (IPv4 and IPv6) for duration: every TCP connection
	// gets back what it sends until it closes, every datagram comes back
	// to its sender; the datagram EchoServeQuit comes back and ends it
	// early. It prints ResultEchoServeReady once listening and reports
	// tcp_conns, tcp_bytes and udp_datagrams (the quit included).
	CheckEchoServe = "echoserve"
	// CheckRR measures latency: one connection to the echo service at
	// vunet.rr="target,duration", 1-byte request/response round trips
	// back to back for duration (after RRWarmup untimed ones): n, p50_us,
	// p99_us, target.
	CheckRR = "rr"
	// CheckGone waits for eth0 to disappear (hot-unplug).
	CheckGone = "gone"
	// CheckTCPHold is a live migration's workload, three things at once
	// for a while (vunet.tcphold="target,duration,bytes"): one ECHO
	// connection held open that echoes a byte every TCPLoopInterval
	// (echoes, hold_max_gap_ms: the longest time between two echoes,
	// hold_error), a DOWN transfer of bytes paced to last the whole
	// duration (down_bytes, down_sha256, down_error), and a new ECHO
	// connection every TCPLoopInterval (new_ok, new_tries,
	// new_max_gap_ms). OK when the held connection never failed, the
	// download completed and some new connection worked.
	CheckTCPHold = "tcphold"
	// CheckDHCPv6 sends a Rapid Commit SOLICIT and reports the REPLY's
	// address (addr), resolvers (dns) and server; run it after the ipv6
	// check, when the link-local address is usable.
	CheckDHCPv6 = "dhcpv6"
	// CheckStreaming starts a download, an upload and a datagram stream
	// to the echo service with the traffic server at vunet.streaming (a
	// target) that outlive the check: it reports once each transfer has
	// moved StreamingMin bytes (down_bytes, up_bytes, udp_sent) and
	// leaves them running, so that the guest powers off with the host
	// still sending through the back-end (its own transmissions stop when
	// the agent takes the link down just before the poweroff). It also holds idle echo
	// connections and closes them as it returns (echo_conns): their
	// closing handshakes run into the poweroff too.
	CheckStreaming = "streaming"
)

// Parameters of the traffic checks.
const (
	ParamUDPEcho = "vunet.udpecho"
	// ParamUDPEchoRounds makes the udpecho check send UDPEchoSizes that
	// many times over (default once).
	ParamUDPEchoRounds = "vunet.udpecho.rounds"
	ParamTCPMany       = "vunet.tcpmany"
	ParamTCPLoop       = "vunet.tcploop"
	ParamTCPServe      = "vunet.tcpserve"
	ParamEchoServe     = "vunet.echoserve"
	ParamRR            = "vunet.rr"
	ParamTCPHold       = "vunet.tcphold"
	ParamStreaming     = "vunet.streaming"
)

// RRWarmup is how many round trips the rr check makes before it starts
// timing: flow set-up, caches, delayed-ACK state.
const RRWarmup = 200

// Target host tokens, resolved in the guest.
const (
	// TargetGW4 is the IPv4 router of the last DHCP lease.
	TargetGW4 = "gw4"
	// TargetGW6 is the guest kernel's IPv6 default router (link-local,
	// from router advertisements), with the zone of eth0.
	TargetGW6 = "gw6"
)

// ResultTCPServeReady is printed by the tcpserve check once it listens.
const ResultTCPServeReady = "tcpserve-ready"

// ResultEchoServeReady is printed by the echoserve check once it listens.
const ResultEchoServeReady = "echoserve-ready"

// EchoServeQuit is the datagram that ends the echoserve check.
const EchoServeQuit = "QUIT"

// TCPLoopInterval is the pace of the tcploop check; each try gives up after
// TCPLoopTryTimeout.
const (
	TCPLoopInterval   = 100 * time.Millisecond
	TCPLoopTryTimeout = time.Second
)

// UDPEchoSizes are the payload sizes the udpecho check sends, in order:
// tiny, around the Ethernet MTU, and up to nearly the largest IPv4 UDP
// payload (the guest's MTU is 65520 by default).
var UDPEchoSizes = []int{1, 2, 17, 64, 100, 512, 1000, 1400, 1472, 1473,
	1500, 2048, 4000, 8192, 9000, 16000, 32000, 48000, 60000, 65000}

// StreamingMin is how many bytes the streaming check waits for in each
// direction before it reports: the transfers are past their start.
const StreamingMin = 1 << 20

// UDPEchoTries bounds the sends of one datagram in the udpecho check.
const UDPEchoTries = 3

// Transfer directions.
const (
	XferDown = "down" // host to guest
	XferUp   = "up"   // guest to host
)

// XferCheck names the transfer check for label.
func XferCheck(label string) string { return CheckXferPrefix + label }

// XferParam is the kernel parameter describing transfer label.
func XferParam(label string) string { return "vunet." + CheckXferPrefix + label }

// XferSpec renders a transfer's parameter value: direction, target and
// size.
func XferSpec(dir, target string, bytes int64) string {
	return dir + "," + target + "," + strconv.FormatInt(bytes, 10)
}

// ParseXferSpec is XferSpec's inverse.
func ParseXferSpec(s string) (dir, target string, bytes int64, err error) {
	f := strings.Split(s, ",")
	if len(f) != 3 {
		return "", "", 0, fmt.Errorf("transfer %q: want dir,target,bytes", s)
	}
	if f[0] != XferDown && f[0] != XferUp {
		return "", "", 0, fmt.Errorf("transfer %q: direction %q", s, f[0])
	}
	n, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || n < 0 {
		return "", "", 0, fmt.Errorf("transfer %q: bytes %q", s, f[2])
	}
	return f[0], f[1], n, nil
}

// Requests a guest sends to the host's TrafficServer, one line each.
// "DOWN <bytes> <seed>": the server sends bytes of Stream(seed) and closes.
// "UP <bytes>": the guest sends bytes, the server answers
// "<bytes> <sha256>\n" with what it received. "ECHO": the server echoes
// everything until EOF.
const (
	ReqDown = "DOWN"
	ReqUp   = "UP"
	ReqEcho = "ECHO"
)

// Stream is the deterministic pseudo-random byte stream of transfers
// (xorshift64*), cheap enough for a TCG guest to generate at line rate.
// A stream is not periodic within any size a test uses, so reordered,
// duplicated or dropped segments change the digest.
type Stream struct {
	s    uint64
	tail [8]byte
	n    int // unread bytes in tail
}

// NewStream starts the stream for seed.
func NewStream(seed uint64) *Stream {
	if seed == 0 {
		seed = 0x9e3779b97f4a7c15
	}
	return &Stream{s: seed}
}

func (st *Stream) next() uint64 {
	st.s ^= st.s >> 12
	st.s ^= st.s << 25
	st.s ^= st.s >> 27
	return st.s * 0x2545f4914f6cdd1d
}

// Read fills p; it never fails.
func (st *Stream) Read(p []byte) (int, error) {
	n := 0
	for st.n > 0 && n < len(p) {
		p[n] = st.tail[8-st.n]
		st.n--
		n++
	}
	for ; n+8 <= len(p); n += 8 {
		binary.LittleEndian.PutUint64(p[n:], st.next())
	}
	if n < len(p) {
		binary.LittleEndian.PutUint64(st.tail[:], st.next())
		st.n = 8
		for n < len(p) {
			p[n] = st.tail[8-st.n]
			st.n--
			n++
		}
	}
	return n, nil
}

// CheckBase strips a "#tag" suffix from a check name: "dhcp#2" runs the
// dhcp check again and reports it under its full name, so one boot can run
// a check twice (before and after a hot-plug, say) and the host can wait
// for each result separately.
func CheckBase(name string) string {
	if i := strings.IndexByte(name, '#'); i >= 0 {
		return name[:i]
	}
	return name
}

package guest

import "time"

// The policy check probes the back-end's address policy (DESIGN.md
// "Address policy") with frames a guest kernel never sends: it builds them
// by hand and puts them on the wire through AF_PACKET.
const (
	// CheckPolicy sends a TCP SYN, a UDP datagram (PolicyProbePayload) and
	// an ICMP echo request to every address in LoopbackSpellings at port
	// vunet.policyport, and the same three from the source 127.0.0.1 to
	// the DHCP router, all to the router's MAC; then it listens
	// PolicyListen for any answer to them (there must be none). With
	// vunet.policylegit=1 it then reaches the router's port the ordinary
	// way: a UDP datagram (PolicyLegitPayload) and a TCP connection through
	// the guest kernel, which the gateway mapping takes to the host's
	// loopback. Reports sent, answers, legit_udp and legit_tcp ("ok" or
	// the error).
	CheckPolicy = "policy"
	// ParamPolicyPort is the destination port of the policy check's frames.
	ParamPolicyPort = "vunet.policyport"
	// ParamPolicyLegit=1 adds the ordinary gateway traffic.
	ParamPolicyLegit = "vunet.policylegit"
)

// LoopbackSpellings are the ways a guest can write a host loopback address
// in an IPv4 or IPv6 header.
var LoopbackSpellings = []string{
	"127.0.0.1", "127.9.9.9", "::1",
	"::ffff:127.0.0.1", "::ffff:127.9.9.9", "::127.0.0.1", "::127.9.9.9",
	// Through a translator or tunnel on the host: NAT64, 6to4, Teredo.
	"64:ff9b::7f00:1", "2002:7f00:1::1", "2001:0:7f00:1::1",
}

// Payloads of the policy check's datagrams, so the host can tell them apart.
const (
	PolicyProbePayload = "vunet-policy-probe"
	PolicyLegitPayload = "vunet-policy-legit"
)

// PolicyListen is how long the policy check waits for answers.
const PolicyListen = 1500 * time.Millisecond

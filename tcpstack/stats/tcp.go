package stats

import "sync/atomic"

// TCPState is a TCP connection's coarse state: the translation's state
// machine (package tcp) runs on these values, and the connections-by-state
// gauge counts them.
type TCPState uint8

// Connection states.
const (
	TCPFree        TCPState = iota // slot unused
	TCPConnecting                  // guest SYN seen, host connect() pending
	TCPSynAckSent                  // host connected, SYN-ACK to the guest, waiting for its ACK
	TCPSynSent                     // host peer accepted on a forwarded port, SYN to the guest, waiting for its SYN-ACK
	TCPEstablished                 // data both ways
	TCPClosing                     // a FIN went or came on either side
	TCPResetting                   // socket gone; an RST to the guest is still due
	// NumTCPStates is the number of states (array size).
	NumTCPStates
)

var tcpStateNames = [NumTCPStates]string{"free", "connecting", "syn_ack_sent", "syn_sent", "established", "closing", "resetting"}

// String returns the metric label value of the state.
func (s TCPState) String() string { return label(tcpStateNames[:], s) }

// TCPRetransCause says why data was sent to the guest again.
type TCPRetransCause uint8

// Retransmission causes.
const (
	// TCPRetransDupAck: the guest repeated an ACK (fast retransmit request).
	TCPRetransDupAck TCPRetransCause = iota
	// TCPRetransTimeout: the guest did not ACK in time.
	TCPRetransTimeout
	// TCPRetransWindow: the guest shut its window on data in flight and
	// reopened it without acknowledging that data.
	TCPRetransWindow
	// TCPRetransSACK: the guest's SACK blocks showed holes in the data in
	// flight (on the third ACK that SACKed more, or at once when nothing
	// more can be sent), or that a hole sent again was lost again; only
	// the holes go again.
	TCPRetransSACK
	// TCPRetransTailProbe: data was in flight, nothing more could be sent
	// and the guest said nothing for two round trips: the last segment
	// went again, for the guest's SACK to show what it misses.
	TCPRetransTailProbe
	// NumTCPRetransCauses is the number of causes (array size).
	NumTCPRetransCauses
)

var retransCauseNames = [NumTCPRetransCauses]string{"dup_ack", "timeout", "window_reopened", "sack", "tail_probe"}

// String returns the metric label value of the cause.
func (c TCPRetransCause) String() string { return label(retransCauseNames[:], c) }

// TCPReason says why a TCP connection failed, was refused or was reset:
// one vocabulary for [TCP.ConnectFailures], [TCP.AcceptRefusals] and
// [TCP.Resets], each of which uses the reasons that can happen to it
// (TCPConnectFailReasons, TCPAcceptRefusalReasons, TCPResetReasons).
type TCPReason uint8

// TCP reasons. Metrics export them by [TCPReason.String]; keep names stable.
const (
	// TCPRefused: the host peer refused the connection (ECONNREFUSED).
	TCPRefused TCPReason = iota
	// TCPUnreachable: no route to the host peer (ENETUNREACH,
	// EHOSTUNREACH, ENETDOWN, EHOSTDOWN).
	TCPUnreachable
	// TCPTimeout: a handshake, retransmission or idle timeout, ours or
	// the kernel's (ETIMEDOUT).
	TCPTimeout
	// TCPPolicy: the address policy refused the guest's SYN.
	TCPPolicy
	// TCPTableFull: every connection slot of the pair was taken.
	TCPTableFull
	// TCPGuestUnknown: a forwarded connection arrived before the guest's
	// MAC and address were known.
	TCPGuestUnknown
	// TCPDuplicate: a forwarded connection whose addresses and ports a
	// connection still in the table has.
	TCPDuplicate
	// TCPGuestRST: the guest reset the connection.
	TCPGuestRST
	// TCPHostReset: the host peer reset the connection, or its socket
	// reported an error (ECONNRESET, EPIPE).
	TCPHostReset
	// TCPSessionEnd: the front-end left or reset the device, or vunet
	// stopped: every connection is reset.
	TCPSessionEnd
	// TCPError: any other failure of a socket call, or a guest segment
	// that broke the handshake.
	TCPError
	// NumTCPReasons is the number of reasons (array size).
	NumTCPReasons
)

var tcpReasonNames = [NumTCPReasons]string{"refused", "unreachable", "timeout", "policy", "table_full",
	"guest_unknown", "duplicate", "guest_rst", "host_reset", "session_end", "error"}

// String returns the metric label value of the reason.
func (r TCPReason) String() string { return label(tcpReasonNames[:], r) }

// The reasons each counter uses; the others stay zero.
var (
	TCPConnectFailReasons   = []TCPReason{TCPRefused, TCPUnreachable, TCPTimeout, TCPPolicy, TCPTableFull, TCPError}
	TCPAcceptRefusalReasons = []TCPReason{TCPTableFull, TCPGuestUnknown, TCPDuplicate}
	TCPResetReasons         = []TCPReason{TCPGuestRST, TCPHostReset, TCPTimeout, TCPSessionEnd, TCPError}
)

// TCP counts TCP translation events of one queue pair. All fields are
// atomics so metrics read them at scrape time while the loop writes them.
type TCP struct {
	// ConnsByState is a gauge of live connections per state, indexed by the
	// state number (see TCPStateName).
	ConnsByState [NumTCPStates]atomic.Int64
	// Connects counts host connect() attempts.
	Connects atomic.Uint64
	// ConnectFailures counts guest connections that were not made, by
	// reason: SYNs the address policy refused or no slot was left for,
	// and host connect() attempts that failed (TCPConnectFailReasons).
	ConnectFailures [NumTCPReasons]atomic.Uint64
	// Accepted counts connections accepted on forwarded host ports;
	// AcceptRefusals those closed at once, by reason
	// (TCPAcceptRefusalReasons).
	Accepted       atomic.Uint64
	AcceptRefusals [NumTCPReasons]atomic.Uint64
	// AcceptBackoffs counts accepts on forwarded ports that failed for want
	// of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) and paused
	// the listener.
	AcceptBackoffs atomic.Uint64
	// Resets counts connections ended by a reset (an RST to the guest, to
	// the host peer or both), by reason (TCPResetReasons). A failed
	// connect also resets the guest's side, counted in ConnectFailures
	// only.
	Resets [NumTCPReasons]atomic.Uint64
	// Stalls counts transitions into STALLED (guest window exhausted or all
	// socket data in flight); Stalled is the number of connections
	// STALLED now (gauge).
	Stalls  atomic.Uint64
	Stalled atomic.Int64
	// ClampAttempts counts applications of the TCP_WINDOW_CLAMP window
	// workaround (made only where the kernel needs it, after a guest ACK
	// of a stalled connection let bytes be consumed); ClampEffective those
	// after which the socket's receive window state grew.
	ClampAttempts, ClampEffective atomic.Uint64
	// WindowProbes counts zero-window probes sent to the guest (its window
	// shut with nothing in flight and data waiting).
	WindowProbes atomic.Uint64
	// ChallengeAcksLimited counts challenge ACKs (RFC 5961: the answer to
	// a guest RST in the window but not at the next byte, a SYN on an
	// established connection, an ACK of data never sent) not sent because
	// the connection had sent one less than 500 ms before.
	ChallengeAcksLimited atomic.Uint64
	// Retransmits counts rewinds of the sequence to the guest, and SACK
	// recoveries (TCPRetransSACK: holes sent again, no rewind), by cause.
	Retransmits [NumTCPRetransCauses]atomic.Uint64
	// RSTSent counts RSTs sent to the guest; RSTReceived RSTs from it.
	RSTSent, RSTReceived atomic.Uint64
	// BytesToGuest and BytesFromGuest count payload bytes committed to guest
	// frames and written to host sockets.
	BytesToGuest, BytesFromGuest atomic.Uint64
	// OutOfOrderKept counts guest payload bytes that came past a hole and
	// were kept (and SACKed) until it was filled; OutOfOrderNoBuffer the
	// times none could be kept because the table held all the buffers it
	// may.
	OutOfOrderKept, OutOfOrderNoBuffer atomic.Uint64
	// DNSForwardConnects counts guest connections to the DNS forward
	// (--dns-forward: the gateway's port 53 goes to a resolver).
	DNSForwardConnects atomic.Uint64
}

// TCPStateName returns the label of state number i of ConnsByState.
func TCPStateName(i int) string { return TCPState(i).String() }

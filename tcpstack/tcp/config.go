package tcp

import (
	"log/slog"
	"time"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/hostsock"
)

// Config configures TCP translation. The zero value is usable: every zero
// field takes the default documented on it.
type Config struct {
	// MaxFlows bounds the connections per queue pair (default 4096). The
	// table is allocated once; a SYN beyond it is answered with RST.
	MaxFlows int
	// OurMAC is the source MAC of frames to the guest.
	OurMAC [6]byte
	// MTU of the guest link (default 65520): frames without GSO stay within it.
	MTU int
	// Source is what host sockets bind to before connecting (passt's
	// -o/--outbound); invalid addresses let the routing table pick.
	Source hostsock.Source
	// Policy decides which guest connections may be made, and to where;
	// nil refuses every one.
	Policy *addrpolicy.Policy
	// SndBuf and RcvBuf pin SO_SNDBUF / SO_RCVBUF on host sockets when
	// non-zero. Zero (the default) leaves the kernel's auto-tuning alone
	// (DESIGN invariant 6); pinning is for experiments.
	SndBuf, RcvBuf int
	// HandshakeTimeout resets a connection whose handshake with the host or
	// the guest does not finish in time (default 10s).
	HandshakeTimeout time.Duration
	// AckTimeout is the guest ACK timeout until the guest's ACKs give a
	// round trip, and the ceiling of the one they give (rto.go, 200 ms at
	// least); it doubles per retry. It is also the first zero-window
	// probe interval (default 2s).
	AckTimeout time.Duration
	// MaxRetrans is how many ACK timeouts in a row reset the connection,
	// counted from AckTimeout: a shorter measured timeout adds the
	// doublings that reach AckTimeout (default 5).
	MaxRetrans int
	// FinTimeout resets a connection stuck half-closed after FINs went both
	// ways or a FIN to the guest stays unacknowledged (default 60s).
	FinTimeout time.Duration
	// IdleTimeout resets a connection with no activity on either side
	// (default 2h).
	IdleTimeout time.Duration
	// AckInterval is how soon a pending ACK or window update to the guest is
	// retried when it could not be decided at once (default 10ms).
	AckInterval time.Duration
	// DelayedAck is how long an ACK for guest data or for the guest's FIN
	// may wait for a frame to carry it (delayed_ack.go; default 1ms,
	// negative: none waits).
	DelayedAck time.Duration
	// AckOnPeerAck makes ACKs to the guest follow tcpi_bytes_acked (what the
	// remote peer acknowledged) for every peer, not only non-loopback ones.
	AckOnPeerAck bool
	// AckOnWrite makes ACKs to the guest follow bytes written to the host
	// socket for every peer. It wins over AckOnPeerAck.
	AckOnWrite bool
	// NoPeekOffset forces the discard-buffer fallback even where SO_PEEK_OFF
	// works (tests, comparisons).
	NoPeekOffset bool
	// NoSACK stops offering SACK to the guest, so data after a hole is
	// dropped and sent again rather than kept (outoforder.go; tests,
	// comparisons).
	NoSACK bool
	// NoWindowClamp disables the TCP_WINDOW_CLAMP window workaround and
	// the start-up experiment that decides whether this kernel needs it
	// (hostsock.ProbeWindowKernel; on the kernels measured it does not).
	NoWindowClamp bool
	// Logger receives debug logs; nil means slog.Default().
	Logger *slog.Logger
}

// defaultMTU is the guest MTU unless configured, as in passt.
const defaultMTU = 65520

func (c *Config) setDefaults() {
	if c.MaxFlows <= 0 {
		c.MaxFlows = 4096
	}
	if c.MTU <= 0 {
		c.MTU = defaultMTU
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = 2 * time.Second
	}
	if c.MaxRetrans <= 0 {
		c.MaxRetrans = 5
	}
	if c.FinTimeout <= 0 {
		c.FinTimeout = 60 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * time.Hour
	}
	if c.AckInterval <= 0 {
		c.AckInterval = 10 * time.Millisecond
	}
	if c.DelayedAck == 0 {
		c.DelayedAck = defaultDelayedAck
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

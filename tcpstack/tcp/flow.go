package tcp

import (
	"net/netip"
	"time"

	"vunet/tcpstack/stats"
)

// connKey identifies a connection by what the guest sees: its own address
// and port, and the remote address and port it talks to.
type connKey struct {
	guestAddr, remoteAddr [16]byte
	guestPort, remotePort uint16
	v6                    bool
}

// Connection events (what happened, for closing) and flags (what is due).
const (
	evSockFin      uint16 = 1 << iota // host socket reached EOF
	evSockShut                        // we shut down the host socket's write side (guest FIN forwarded)
	evGuestFin                        // guest FIN received (in order)
	evGuestFinSent                    // FIN sent to the guest
	evGuestFinAck                     // guest acknowledged our FIN
	evSockRdHup                       // epoll reported the peer's FIN (data before it may still be queued)
)

const (
	flStalled   uint16 = 1 << iota // not reading the socket: guest window full or all data in flight
	flSynAckDue                    // SYN-ACK to the guest not sent yet
	flAckDue                       // ACK or window update to the guest due
	flRstDue                       // RST to the guest due (socket already closed)
	flDirty                        // in the table's output list
	flLocal                        // peer on this host: ACK the guest on write
	flWantOut                      // EPOLLOUT wanted: the send buffer is full (a write was short, or the kernel would call it not writable)
	flConnected                    // host connect() completed
	flWndStall                     // the stall is the guest's window (as opposed to no new socket data)
	flRxBlocked                    // waiting for guest RX buffers with data to send
	flSynDue                       // SYN to the guest (forwarded connection) not sent yet
	flOutArmed                     // the kernel was polled while its send buffer was full: it wakes us with EPOLLOUT
	flAckCheck                     // the delayed-ACK timer fired: send an ACK only if the ACK number or window moved
	flZeroWnd                      // the guest advertised a zero window with data in flight (ignored, but a reopening resends at once)
	flProbeDue                     // a zero-window probe to the guest is due
)

// conn is one translated connection. Sequence numbers follow passt's
// naming: "to guest" is the direction host socket → guest.
type conn struct {
	key    connKey
	fd     int
	slot   int32
	gen    uint32
	fp     uint64 // fingerprint in the directory (directory.go); 0: none
	state  stats.TCPState
	events uint16
	flags  uint16

	guestMAC   [6]byte
	guestAddr  netip.Addr
	remoteAddr netip.Addr // as the guest sees it (before gateway mapping)
	guestPort  uint16
	remotePort uint16

	// Host socket → guest.
	iss             uint32 // our initial sequence number (SYN-ACK)
	seqToGuest      uint32 // next sequence to send; advances only on Commit
	sndMax          uint32 // highest sequence ever sent (seqToGuest before any rewind)
	seqAckFromGuest uint32 // highest ACK from the guest (socket data before it is consumed)
	eofSeq          uint32 // seqToGuest where the socket's EOF was seen (valid with evSockFin)
	wndFromGuest    uint32 // guest's receive window in bytes (scaled)
	wsFromGuest     uint8  // guest's window scale (0 when it sent none)
	mssToGuest      int    // payload per segment: guest MSS, limited by the MTU
	recover         uint32 // sndMax at the last rewind or SACK recovery start: duplicate ACKs that do not pass it rewind nothing (RFC 6582); an ACK that reaches it ends the recovery
	dupAcks         uint8
	retrans         uint8 // ACK timeouts in a row; with nothing in flight, zero-window probes in a row

	// SACK recovery towards the guest (sack_recovery.go).
	sackRecovery bool
	sackN        uint8                   // blocks in sackBlk
	sackBlk      [sackMaxBlocks]seqRange // the guest's latest SACK blocks above its ACK, sorted, disjoint
	sackHigh     uint32                  // highest sequence the guest SACKed (meaningful while above seqAckFromGuest)
	rtxNext      uint32                  // in SACK recovery: the holes below it went again (RFC 6675's HighRxt)
	rtxMark      uint32                  // sndMax when the hole at the guest's ACK last went again
	tlp          uint8                   // tail-loss probe: tlpDue, tlpSent (since the last ACK progress) or 0

	// Round-trip time to the guest (rto.go).
	srtt, rttvar time.Duration // smoothed RTT and its variation; srtt 0: no sample yet
	rttAt        time.Time     // when the byte before rttSeq was sent; zero: none timed
	rttSeq       uint32

	// Guest → host socket.
	seqInitFromGuest uint32 // guest's ISN
	ackBase          uint32 // sequence that tcpi_bytes_acked == 0 stands for
	sndBuf           int    // SO_SNDBUF as last read
	sndBufAt         time.Time
	sndRatio         uint16 // payload bytes per sndRatioOne bytes of send-buffer memory, as last seen; 0: unknown
	seqFromGuest     uint32 // next byte expected from the guest (all before it written to the socket)
	seqAckToGuest    uint32 // ACK number in our frames
	ackSent          uint32 // ACK number in the last frame sent
	wndToGuest       uint32 // window we advertise, bytes
	wndSent          uint32 // window in the last frame sent, bytes
	wndEdgeSpan      uint32 // the window the last refresh opened, whose right edge may stand for later passes (wndHolds); 0: it must not
	maxWndSent       uint32 // largest window ever sent: the guest's MSS is at most half of it
	wsToGuest        uint8  // our window scale towards the guest
	dupAckSeq        uint32 // seqFromGuest the last duplicate ACKs announced
	dupAckSent       bool
	dupAcksDue       uint8
	guestSACK        bool    // the guest offered SACK: we accept it (outoforder.go)
	ooo              *oooBuf // data past a hole, kept and SACKed; nil: none
	senderPeriod     int64   // senderPeriod in which it last wrote guest data (ring_budget.go)

	epollEvents uint32 // events currently registered
	inEpoll     bool
	epollDue    bool // a new mask waits in epollQ for SyncEpoll (epoll.go)

	// Hints that save system calls; false is always safe (a handed-over
	// connection starts without them).
	drained  bool // the last read emptied the socket: no read until EPOLLIN (syscall_hints.go)
	sendIdle bool // the last ACK/window refresh found the send side idle (syscall_hints.go)
	urgent   bool // epoll reported urgent data (EPOLLPRI) since the last empty read: a short read may have stopped at its mark
	peekOff  bool // the socket is read at SO_PEEK_OFF, not past the discard buffer
	dialV6   bool // with dialled: the host socket is AF_INET6 (kernel_probe.go)
	dialled  bool // we made the socket (connect), so dialV6 holds; else ask it
	sole     bool // our descriptor is the socket's only one: closing it leaves the epoll set (teardown.go)
	clamp    int  // last TCP_WINDOW_CLAMP applied (0: never)
	// consumeDue is what the guest acknowledged in this batch, still in
	// the socket (consume.go).
	consumeDue uint32

	created      time.Time
	lastActivity time.Time     // any segment from the guest or socket event
	lastAckProg  time.Time     // guest ACK progress or data first sent after idle: ACK-timeout base
	ackDueAt     time.Time     // zero: no delayed ACK check pending
	delAckAt     time.Time     // an ACK for guest data waits for a frame to carry it until then (delayed_ack.go); zero: none waits
	delAckOff    bool          // a delayed ACK went uncarried: this connection's ACKs go at once, for a spell (delayed_ack.go)
	delAckProbe  bool          // with delAckOff: whether the guest waited for that ACK is not known yet
	delAckRetry  uint16        // with delAckOff: exchanges left before ACKs wait again (delayed_ack.go)
	delAckSpell  uint16        // exchanges the last at-once spell lasted; doubles each time the guest is found waiting
	delAckTurn   bool          // during a spell: guest data came since the last exchange ended (delayed_ack.go)
	ackCheckIvl  time.Duration // delay of the next delayed-ACK check (backed off while nothing changes); 0: AckInterval
	challengeAt  time.Time     // the last challenge ACK (challenge.go)

	nextOut int32 // output list link
}

func seqLT(a, b uint32) bool { return int32(a-b) < 0 }
func seqGT(a, b uint32) bool { return int32(a-b) > 0 }

func seqMax(a, b uint32) uint32 {
	if seqGT(b, a) {
		return b
	}
	return a
}

// inFlight is the data sent to the guest and not acknowledged yet.
func (f *conn) inFlight() uint32 { return f.seqToGuest - f.seqAckFromGuest }

func (f *conn) has(ev uint16) bool { return f.events&ev == ev }

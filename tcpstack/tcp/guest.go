package tcp

import (
	"math/rand/v2"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// segment is a guest TCP segment with its headers parsed out of the
// copied head, and where its payload is in guest memory.
type segment struct {
	key        connKey
	srcMAC     [6]byte
	src, dst   netip.Addr
	srcPort    uint16
	dstPort    uint16
	seq, ack   uint32
	flags      header.TCPFlags
	wnd        uint16
	opts       header.TCPOptions
	payloadOff int // from the start of the Ethernet frame
	payloadLen int
}

// segmentFrom fills sg from p, a parsed guest frame. It reports false for
// anything that is not a well-formed TCP segment: no TCP header, or one
// that header.ParseFrame found truncated or malformed, or a fragment.
func segmentFrom(p *header.Packet, sg *segment) bool {
	th := p.TCP
	if th == nil {
		return false
	}
	sg.srcMAC = p.SourceMAC()
	sg.src, sg.dst = p.Src, p.Dst
	sg.srcPort = th.SourcePort()
	sg.dstPort = th.DestinationPort()
	sg.seq = th.SequenceNumber()
	sg.ack = th.AckNumber()
	sg.flags = th.Flags()
	sg.wnd = th.WindowSize()
	sg.opts = header.TCPOptions{}
	if sg.flags.Has(header.TCPFlagSYN) {
		// A bad option list leaves what decoded before it; the SYN is still
		// answered with defaults, as a host stack would.
		_ = header.ParseTCPOptions(th.Options(), &sg.opts)
	}
	sg.payloadOff = p.L4Off + len(th)
	sg.payloadLen = p.L4Len - len(th)
	sg.key = connKey{
		guestAddr:  sg.src.As16(),
		remoteAddr: sg.dst.As16(),
		guestPort:  sg.srcPort,
		remotePort: sg.dstPort,
		v6:         sg.src.Is6(),
	}
	return true
}

// HandleGuestFrame translates one guest frame carrying TCP. p is the
// frame's parse (header.ParseFrame, of a copy of its first bytes); the
// frame itself is p.Len bytes at byte offset skip of the iovecs frame
// (guest memory: the TX chain's readable buffers, skip = virtio-net header
// length). Headers are only ever read from p; payload is written to the
// host socket straight from frame. It reports false for a frame that is
// not a well-formed TCP segment (the caller counts the drop).
func (t *Table) HandleGuestFrame(now time.Time, p *header.Packet, frame [][]byte, skip int) bool {
	sg := &t.seg
	if !segmentFrom(p, sg) {
		return false
	}
	s, ok := t.byKey[sg.key]
	if !ok {
		// Connections exist only where the address policy let them; a
		// segment without one is judged before it opens one or gets an RST.
		v := t.policy.Outbound(now, addrpolicy.TCP, sg.src, netip.AddrPortFrom(sg.dst, sg.dstPort))
		if !v.Allowed() {
			return true
		}
		t.learnGuest(sg)
		if sg.flags&(header.TCPFlagSYN|header.TCPFlagACK|header.TCPFlagRST|header.TCPFlagFIN) == header.TCPFlagSYN {
			t.connect(now, sg, v.Host)
		} else {
			t.queueRST(sg)
		}
		return true
	}
	t.learnGuest(sg)
	f := &t.flows[s]
	t.guestSegment(now, f, sg, frame, skip)
	if f.state != stats.TCPFree {
		t.noteTimer(t.deadline(f))
	}
	return true
}

// wsToGuestDefault is the window scale we offer the guest: 2^8 × 64 KiB covers
// maxWindow.
const wsToGuestDefault = 8

// dupAcksToSend is how many duplicate ACKs announce a gap (Linux's default
// reordering threshold).
const dupAcksToSend = 3

// mssDefault is the MSS assumed when the guest's SYN has none (RFC 9293).
const mssDefault = 536

func (t *Table) ipHdrLen(v6 bool) int {
	if v6 {
		return header.IPv6MinimumSize
	}
	return header.IPv4MinimumSize
}

// connect starts a host connection to host (where the address policy sends
// the guest's destination) for a guest SYN.
func (t *Table) connect(now time.Time, sg *segment, host netip.AddrPort) {
	if sg.srcPort == 0 || sg.dstPort == 0 {
		return
	}
	f := t.alloc(sg.key)
	if f == nil {
		t.stats.TableFull.Add(1)
		t.queueRST(sg)
		return
	}
	f.guestMAC = sg.srcMAC
	f.guestAddr, f.remoteAddr = sg.src, sg.dst
	f.guestPort, f.remotePort = sg.srcPort, sg.dstPort
	f.seqInitFromGuest = sg.seq
	f.ackBase = sg.seq // tcpi_bytes_acked counts the SYN of a connect()ed socket
	f.seqFromGuest = sg.seq + 1
	f.seqAckToGuest = f.seqFromGuest
	mss := mssDefault
	if sg.opts.HasMSS && sg.opts.MSS > 0 {
		mss = int(sg.opts.MSS)
	}
	f.mssToGuest = max(min(mss, t.cfg.MTU-t.ipHdrLen(sg.key.v6)-header.TCPMinimumSize), 64)
	if sg.opts.HasWindowScale {
		f.wsFromGuest = min(sg.opts.WindowScale, header.TCPMaxWindowScale)
		f.wsToGuest = wsToGuestDefault
	}
	f.wndFromGuest = max(uint32(sg.wnd), 1) // RFC 7323: the SYN's window is not scaled
	f.guestSACK = sg.opts.SACKPermitted
	f.iss = rand.Uint32()
	f.seqToGuest = f.iss
	f.sndMax = f.iss
	f.seqAckFromGuest = f.iss
	f.created, f.lastActivity = now, now

	if host.Addr().IsLoopback() {
		f.flags |= flLocal
	}
	t.stats.Connects.Add(1)
	fd, inProgress, err := t.dial(host, t.cfg.SndBuf, t.cfg.RcvBuf)
	t.setState(f, stats.TCPConnecting)
	if err != nil {
		t.stats.ConnectFailures.Add(1)
		t.log.Debug("tcp connect failed", "dst", host, "err", err)
		t.resetFlow(f, now)
		return
	}
	f.fd = fd
	if !inProgress {
		t.connected(f)
	}
	t.updateEpoll(f)
	t.noteTimer(t.deadline(f))
}

// connected moves f on once its host connect() completed: the SYN-ACK to
// the guest is due only now, so the guest never sees a connection the host
// could not make.
func (t *Table) connected(f *conn) {
	f.flags |= flConnected | flSynAckDue
	t.setState(f, stats.TCPSynAckSent)
	t.markDirty(f)
}

// establish finishes the handshake on the guest's ACK of our SYN-ACK.
func (t *Table) establish(now time.Time, f *conn) {
	t.setState(f, stats.TCPEstablished)
	f.seqAckFromGuest = f.iss + 1
	f.lastAckProg = now
	if t.peekOff {
		if err := hostsock.SetInt(f.fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, 0); err != nil {
			t.log.Debug("tcp SO_PEEK_OFF failed", "err", err)
			t.resetFlow(f, now)
			return
		}
	}
	t.updateEpoll(f)
	// The host peer may have sent data already (it spoke first): read it.
	t.markDirty(f)
}

// guestSegment handles a segment for an existing connection.
func (t *Table) guestSegment(now time.Time, f *conn, sg *segment, frame [][]byte, skip int) {
	if f.state != stats.TCPResetting {
		// A resetting flow's deadline runs from the reset: a guest that
		// keeps sending but never refills RX must not keep its slot.
		f.lastActivity = now
	}
	if sg.flags.Has(header.TCPFlagRST) {
		t.stats.RSTReceived.Add(1)
		t.dropFlow(f, true)
		return
	}
	syn := sg.flags.Has(header.TCPFlagSYN)
	switch f.state {
	case stats.TCPResetting:
		return
	case stats.TCPSynSent:
		t.guestSynAck(now, f, sg)
		return
	case stats.TCPConnecting:
		// A retransmitted SYN while connect() is pending: the SYN-ACK goes
		// when the host connection is up; never reset here (invariant 8).
		return
	case stats.TCPSynAckSent:
		if syn && !sg.flags.Has(header.TCPFlagACK) {
			if sg.seq == f.seqInitFromGuest {
				f.flags |= flSynAckDue // our SYN-ACK may have been lost
				t.markDirty(f)
			}
			return
		}
		if !sg.flags.Has(header.TCPFlagACK) {
			return
		}
		// The SYN-ACK went out once (seqToGuest moved past iss): an ACK of
		// it is good even if a retransmitted SYN, in the same batch, asked
		// for it again; that repeat is then moot.
		if sg.ack != f.iss+1 || f.seqToGuest != f.iss+1 {
			t.resetFlow(f, now)
			return
		}
		f.flags &^= flSynAckDue
		t.establish(now, f)
		if f.state != stats.TCPEstablished {
			return
		}
	}
	if syn || !sg.flags.Has(header.TCPFlagACK) {
		// A SYN on an established connection, or a segment without ACK:
		// answer with an ACK that tells the guest where we are (RFC 9293
		// 3.10.7.4) and drop it.
		f.flags |= flAckDue
		t.markDirty(f)
		return
	}
	if !t.guestAck(now, f, sg) {
		return
	}
	t.guestData(now, f, sg, frame, skip)
}

// guestAck processes the ACK number and window of sg. It reports false when
// the segment must be dropped.
func (t *Table) guestAck(now time.Time, f *conn, sg *segment) bool {
	ack := sg.ack
	if seqGT(ack, f.sndMax) {
		// ACKs data we never sent.
		f.flags |= flAckDue
		t.markDirty(f)
		return false
	}
	wnd := min(uint32(sg.wnd)<<f.wsFromGuest, maxWindow)
	progressed := false
	if seqGT(ack, f.seqAckFromGuest) {
		dataEnd := ack
		if f.has(evSockFin) && seqGT(ack, f.eofSeq) {
			dataEnd = f.eofSeq // our FIN is not a byte in the socket
			f.events |= evGuestFinSent | evGuestFinAck
		}
		n := dataEnd - f.seqAckFromGuest
		if n > 0 && f.fd >= 0 {
			r, err := hostsock.Discard(f.fd, int(n))
			if err != nil || r != int(n) {
				t.log.Debug("tcp consume failed", "want", n, "got", r, "err", err)
				t.resetFlow(f, now)
				return false
			}
		}
		f.seqAckFromGuest = ack
		if seqGT(ack, f.seqToGuest) {
			// An ACK for data sent before a rewind: skip what it covers.
			// SO_PEEK_OFF moved back with the discard and stops at 0,
			// which is exactly ack now.
			f.seqToGuest = ack
		}
		f.retrans = 0
		f.dupAcks = 0
		f.lastAckProg = now
		progressed = true
	} else if ack == f.seqAckFromGuest && sg.payloadLen == 0 && !sg.flags.Has(header.TCPFlagFIN) &&
		wnd == f.wndFromGuest && f.inFlight() > 0 {
		f.dupAcks++
		if f.dupAcks == 2 {
			// The guest is asking for the data after ack again.
			t.rewind(f, stats.TCPRetransDupAck)
		}
	}
	// A zero window while data is in flight is ignored, as passt does: some
	// guest kernels send one transiently when short of memory ("net: tcp:
	// send zero-window ACK when no memory"), and taking it would stall us.
	opened := false
	if wnd != 0 || f.inFlight() == 0 {
		opened = wnd > f.wndFromGuest
		f.wndFromGuest = wnd
	}
	if progressed || opened {
		if f.flags&flStalled != 0 {
			t.unstall(f)
		}
		t.markDirty(f)
	}
	return true
}

// unstall implements DESIGN invariant 4 on a guest ACK or window opening:
// clear STALLED, re-apply the window clamp so the kernel recomputes the
// window it advertises to the host peer, and read the socket right away
// (markDirty: the loop's output pass this iteration), not waiting for epoll.
func (t *Table) unstall(f *conn) {
	f.flags &^= flStalled | flWndStall
	t.applyClampWorkaround(f)
	t.updateEpoll(f)
	t.markDirty(f)
}

// applyClampWorkaround re-sets TCP_WINDOW_CLAMP to the socket's current
// clamp, raised to the window it already advertises if that is larger.
//
// On Linux 6.1–6.5, consuming data with MSG_TRUNC after a zero window did
// not make the kernel advertise the reopened window; setting the clamp
// forced the recomputation (passt commit "Force TCP_WINDOW_CLAMP before
// resetting STALLED flag"). Since the "mid stream window clamp" change
// (~6.7), a clamp below the current window shrinks it at once, and a clamp
// taken from a momentarily tiny guest window could lock the host window
// near zero. So the value is never derived from the guest's window: it is
// the kernel's own clamp (never below the advertised receive window, never
// zero). On 6.7+ setting an unchanged clamp is a no-op in the kernel, so the
// workaround cannot hurt there.
func (t *Table) applyClampWorkaround(f *conn) {
	if t.cfg.NoWindowClamp || f.fd < 0 {
		return
	}
	cur, err := hostsock.GetInt(f.fd, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP)
	if err != nil || cur <= 0 {
		return
	}
	v := cur
	if hostsock.TCPInfo(f.fd, &t.info) && int(t.info.Rcv_wnd) > v {
		v = int(t.info.Rcv_wnd)
	}
	if hostsock.SetInt(f.fd, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, v) != nil {
		return
	}
	f.clamp = v
	t.stats.ClampApplications.Add(1)
}

// rewind makes the next output pass send again from the guest's last ACK.
func (t *Table) rewind(f *conn, cause stats.TCPRetransCause) {
	if f.inFlight() == 0 {
		return
	}
	if f.has(evGuestFinSent) && !f.has(evGuestFinAck) {
		f.events &^= evGuestFinSent
	}
	f.seqToGuest = f.seqAckFromGuest
	f.dupAcks = 0
	if t.peekOff && f.fd >= 0 {
		if err := hostsock.SetInt(f.fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, 0); err != nil {
			t.log.Debug("tcp SO_PEEK_OFF reset failed", "err", err)
		}
	}
	t.stats.Retransmits[cause].Add(1)
	if f.flags&flStalled != 0 {
		f.flags &^= flStalled | flWndStall
		t.updateEpoll(f)
	}
	t.markDirty(f)
}

// guestData writes sg's payload to the host socket and handles its FIN.
func (t *Table) guestData(now time.Time, f *conn, sg *segment, frame [][]byte, skip int) {
	l := sg.payloadLen
	fin := sg.flags.Has(header.TCPFlagFIN)
	if l == 0 && !fin {
		if seqLT(sg.seq, f.seqFromGuest) {
			f.flags |= flAckDue // keep-alive probe
			t.markDirty(f)
		}
		return
	}
	if f.has(evGuestFin) {
		if fin || l > 0 {
			f.flags |= flAckDue // retransmitted FIN: our ACK was lost
			t.markDirty(f)
		}
		return
	}
	off := int32(f.seqFromGuest - sg.seq)
	if off < 0 {
		// A gap: something before this segment is missing (a write to the
		// host socket came up short). Drop it and repeat our ACK, three
		// times over once per gap, so the guest's fast retransmit resends
		// from there instead of waiting for its retransmission timeout.
		f.flags |= flAckDue
		if !f.dupAckSent || f.dupAckSeq != f.seqFromGuest {
			f.dupAckSent, f.dupAckSeq, f.dupAcksDue = true, f.seqFromGuest, dupAcksToSend
		}
		t.markDirty(f)
		return
	}
	if l > 0 {
		if int(off) >= l {
			f.flags |= flAckDue // all old: the guest missed our ACK
			t.markDirty(f)
		} else if f.fd >= 0 {
			n, err := t.io.Send(f.fd, frame, skip+sg.payloadOff+int(off), l-int(off))
			switch err {
			case nil:
			case unix.EAGAIN:
				n = 0
			default:
				t.log.Debug("tcp write to host failed", "err", err)
				t.resetFlow(f, now)
				return
			}
			f.seqFromGuest += uint32(n)
			t.stats.BytesFromGuest.Add(uint64(n))
			if n < l-int(off) {
				// The socket is full: the guest retransmits the rest; we
				// tell it when space frees up (EPOLLOUT → window update).
				// The refused write set SOCK_NOSPACE, so the kernel wakes
				// us without a poll.
				f.flags |= flWantOut | flOutArmed
				t.updateEpoll(f)
			}
			f.flags |= flAckDue
			t.markDirty(f)
		}
	}
	if fin && sg.seq+uint32(l) == f.seqFromGuest {
		f.seqFromGuest++
		f.events |= evGuestFin
		if f.fd >= 0 {
			_ = unix.Shutdown(f.fd, unix.SHUT_WR)
			f.events |= evSockShut
		}
		t.setState(f, stats.TCPClosing)
		f.flags |= flAckDue
		t.markDirty(f)
	}
}

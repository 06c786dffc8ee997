package tcp

import (
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// Opening a connection for a guest SYN: the host connect() first, the
// SYN-ACK to the guest only once it completed.

// wsToGuestDefault is the window scale we offer the guest: 2^8 × 64 KiB covers
// maxWindow.
const wsToGuestDefault = 8

// mssDefault and mssDefault6 are the MSS assumed when the guest's SYN has
// none: RFC 9293 3.7.1's 536 for IPv4, and for IPv6 the IPv6 minimum MTU
// (1280, RFC 8200) less the IPv6 and TCP headers.
const (
	mssDefault  = 536
	mssDefault6 = 1280 - 40 - 20
)

func (t *Table) ipHdrLen(v6 bool) int {
	if v6 {
		return header.IPv6MinimumSize
	}
	return header.IPv4MinimumSize
}

// connect starts a host connection for a guest SYN to where the address
// policy's verdict v sends the guest's destination.
func (t *Table) connect(now time.Time, sg *segment, v addrpolicy.Verdict) {
	host := v.Host
	if sg.srcPort == 0 || sg.dstPort == 0 {
		return
	}
	f := t.alloc(sg.key)
	if f == nil {
		t.stats.ConnectFailures[stats.TCPTableFull].Add(1)
		t.queueRST(sg)
		return
	}
	t.qstats.Flows.Opened[stats.FlowTCP].Add(1)
	f.guestMAC = sg.srcMAC
	f.guestAddr, f.remoteAddr = sg.src, sg.dst
	f.guestPort, f.remotePort = sg.srcPort, sg.dstPort
	f.ackBase = sg.seq             // tcpi_bytes_acked counts the SYN of a connect()ed socket
	f.wsToGuest = wsToGuestDefault // offered; dropped if the guest's SYN has none
	t.takeGuestSyn(f, sg)
	f.iss = t.newISS()
	f.seqToGuest = f.iss
	f.sndMax = f.iss
	f.recover, f.sackHigh = f.iss, f.iss
	f.seqAckFromGuest = f.iss
	f.created, f.lastActivity = now, now

	if host.Addr().IsLoopback() {
		f.flags |= flLocal
	}
	t.stats.Connects.Add(1)
	if v.DNSForward {
		t.stats.DNSForwardConnects.Add(1)
	}
	fd, inProgress, err := t.dial(host, t.cfg.SndBuf, t.cfg.RcvBuf)
	t.setState(f, stats.TCPConnecting)
	if err != nil {
		t.log.Debug("tcp connect failed", "dst", host, "err", err)
		t.connectFailed(f, now, connectReason(err))
		return
	}
	f.fd = fd
	f.dialled, f.dialV6 = true, !host.Addr().Is4() // hostsock.DialTCP's family
	f.sole = true
	if inProgress && f.flags&flLocal != 0 {
		if inProgress = t.settleLocalConnect(f, now); f.fd < 0 {
			return // refused: the RST to the guest is queued
		}
	}
	if !inProgress {
		t.connected(f)
	}
	t.updateEpoll(f)
	t.noteDeadline(f)
}

// tcpi_state values (the kernel's TCP states, include/net/tcp_states.h).
const (
	tcpiEstablished = 1
	tcpiClose       = 7
)

// settleLocalConnect finds out whether a connect() to this host's loopback
// that reported EINPROGRESS is in fact already over, and reports whether
// it is still in progress. On loopback the whole handshake usually runs
// inside the connect() call (the SYN, the listener's SYN-ACK and our ACK
// are processed in the softirq its transmit raises, and by the time the
// call returns the socket is established, or closed by the listener's
// RST); a non-blocking connect() says EINPROGRESS all the same. Asking
// TCP_INFO (one getsockopt) lets the SYN-ACK, or the RST, go to the guest
// in this very pass: without it, the connection waited for EPOLLOUT (an
// epoll_ctl to watch it, a loop pass and an interrupt of the guest for
// the SYN-ACK alone, SO_ERROR, another epoll_ctl), which measured as a
// large part of vunet's cost per connection in the rig's
// connect/1-byte/close test. The SYN-ACK's window takes the same TCP_INFO
// (keepConnectInfo).
func (t *Table) settleLocalConnect(f *conn, now time.Time) bool {
	// connectInfo is about to hold f's state: an earlier connection's,
	// kept in this pass, must not pass for it.
	t.dropConnectInfo()
	t.infoReads++
	if !hostsock.TCPInfo(f.fd, &t.connectInfo) {
		return true
	}
	switch t.connectInfo.State {
	case tcpiEstablished:
		t.keepConnectInfo(f)
		return false
	case tcpiClose:
		soErr, err := hostsock.GetInt(f.fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil || soErr == 0 {
			return true // closed without an error: let epoll report it
		}
		t.log.Debug("tcp connect failed", "remote", f.remoteAddr, "port", f.remotePort, "err", unix.Errno(soErr))
		t.connectFailed(f, now, connectReason(unix.Errno(soErr)))
		return true
	}
	return true
}

// takeGuestSyn records what the guest's SYN (or SYN-ACK) says: its initial
// sequence number, its MSS (bounded by the guest's MTU), window scale,
// window and SACK. A guest that does not scale gets no scaling from us
// either (RFC 7323).
func (t *Table) takeGuestSyn(f *conn, sg *segment) {
	f.seqInitFromGuest = sg.seq
	f.seqFromGuest = sg.seq + 1
	f.seqAckToGuest = f.seqFromGuest
	mss := mssDefault
	if f.key.v6 {
		mss = mssDefault6
	}
	if sg.opts.HasMSS && sg.opts.MSS > 0 {
		mss = int(sg.opts.MSS)
	}
	f.mssToGuest = max(min(mss, t.cfg.MTU-t.ipHdrLen(f.key.v6)-header.TCPMinimumSize), 64)
	if sg.opts.HasWindowScale {
		f.wsFromGuest = min(sg.opts.WindowScale, header.TCPMaxWindowScale)
	} else {
		f.wsFromGuest, f.wsToGuest = 0, 0
		// A window computed for our SYN with a scale the guest refused
		// may exceed what a frame can say unscaled; it stands (wndHolds)
		// only as far as the frames carried it.
		f.wndToGuest = min(f.wndToGuest, 0xffff)
		f.wndEdgeSpan = min(f.wndEdgeSpan, 0xffff)
	}
	f.wndFromGuest = max(uint32(sg.wnd), 1) // the SYN's window is not scaled
	f.guestSACK = sg.opts.SACKPermitted
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
	f.retrans = 0 // SYN-ACKs sent again count no more
	t.usePeekOffset(f)
	inlineUrgent(f.fd)
	t.updateEpoll(f)
	// The host peer may have sent data already (it spoke first): read it.
	t.markDirty(f)
}

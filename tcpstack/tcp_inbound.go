package tcpstack

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// Inbound port forwarding: a host listener accepts a connection, and the
// table opens the guest side with a SYN of its own; the guest's SYN-ACK
// establishes it. After that it is translated like a guest connection.

// tcpListener is an open forwarded port.
type tcpListener struct {
	fd        int
	v6        bool
	guestPort uint16
}

// tcpAcceptBatch bounds accepts per event so a flood cannot starve the loop;
// edge-triggered epoll would not report the rest, so the listener is
// level-triggered.
const tcpAcceptBatch = 32

// SetGuest tells the table the guest's MAC and addresses, the destination
// of forwarded connections. Guest TCP frames also teach them.
func (t *tcpTable) SetGuest(mac [6]byte, v4, v6 netip.Addr) {
	if mac != ([6]byte{}) {
		t.guestMAC = mac
	}
	if v4.Is4() {
		t.guestV4 = v4
	}
	if v6.Is6() {
		t.guestV6 = v6
	}
}

// learnGuest notes the guest's MAC and address from a segment it sent.
func (t *tcpTable) learnGuest(sg *tcpSegment) {
	t.guestMAC = sg.srcMAC
	if sg.src.Is4() {
		t.guestV4 = sg.src
	} else if !sg.src.IsLinkLocalUnicast() {
		t.guestV6 = sg.src
	}
}

// Listen opens a forwarded host port and returns the port it listens on.
func (t *tcpTable) Listen(fw TCPForward) (uint16, error) {
	addr := fw.HostAddr
	if !addr.IsValid() {
		addr = netip.IPv4Unspecified()
	}
	fd, port, err := hostsock.ListenTCP(netip.AddrPortFrom(addr, fw.HostPort), fw.Iface)
	if err != nil {
		return 0, err
	}
	gp := fw.GuestPort
	if gp == 0 {
		gp = port
	}
	i := len(t.listeners)
	t.listeners = append(t.listeners, tcpListener{fd: fd, v6: addr.Is6(), guestPort: gp})
	if t.poll != nil {
		if err := t.poll.Add(fd, unix.EPOLLIN, t.listenerToken(i)); err != nil {
			unix.Close(fd)
			t.listeners = t.listeners[:i]
			return 0, fmt.Errorf("forward epoll: %w", err)
		}
	}
	return port, nil
}

func (t *tcpTable) listenerToken(i int) hostsock.Token {
	return hostsock.NewToken(hostsock.OwnerTCPListener, 0, uint32(i))
}

// closeListeners closes the forwarded ports.
func (t *tcpTable) closeListeners() {
	for _, l := range t.listeners {
		if t.poll != nil {
			_ = t.poll.Del(l.fd)
		}
		unix.Close(l.fd)
	}
	t.listeners = nil
}

// accept takes the pending connections of listener i.
func (t *tcpTable) accept(now time.Time, i int) {
	if i >= len(t.listeners) {
		return
	}
	l := &t.listeners[i]
	for n := 0; n < tcpAcceptBatch; n++ {
		fd, peer, err := hostsock.Accept(l.fd)
		if err != nil {
			return // EAGAIN, or an error the next event retries
		}
		if !t.inbound(now, fd, peer, l.guestPort) {
			t.stats.AcceptRefused.Add(1)
			hostsock.CloseWithReset(fd)
		}
	}
}

// inbound opens the guest side of an accepted connection.
func (t *tcpTable) inbound(now time.Time, fd int, peer netip.AddrPort, guestPort uint16) bool {
	// A loopback peer appears as the gateway, which the guest answers.
	remote, _ := t.policy.Policy.InboundSource(peer.Addr())
	guest := t.guestV4
	if remote.Is6() {
		guest = t.guestV6
	}
	if !guest.IsValid() || t.guestMAC == ([6]byte{}) || !remote.IsValid() {
		t.log.Debug("tcp forward: guest address unknown, connection refused", "peer", peer)
		return false
	}
	key := tcpKey{guestAddr: guest.As16(), remoteAddr: remote.As16(), guestPort: guestPort,
		remotePort: peer.Port(), v6: guest.Is6()}
	if _, busy := t.byKey[key]; busy {
		return false
	}
	f := t.alloc(key)
	if f == nil {
		t.stats.TableFull.Add(1)
		return false
	}
	t.stats.Accepted.Add(1)
	f.fd = fd
	f.guestMAC = t.guestMAC
	f.guestAddr, f.remoteAddr = guest, remote
	f.guestPort, f.remotePort = guestPort, peer.Port()
	if peer.Addr().IsLoopback() {
		f.flags |= flLocal
	}
	hostsock.TuneTCP(fd, t.cfg.SndBuf, t.cfg.RcvBuf)
	f.mssToGuest = max(t.cfg.MTU-t.ipHdrLen(key.v6)-header.TCPMinimumSize, 64)
	f.wsToGuest = tcpWsToGuest // offered; dropped if the guest's SYN-ACK has none
	f.wndFromGuest = 1
	f.iss = rand.Uint32()
	f.seqToGuest, f.sndMax, f.seqAckFromGuest = f.iss, f.iss, f.iss
	f.created, f.lastActivity, f.lastAckProg = now, now, now
	f.flags |= flConnected | flSynDue
	t.setState(f, stats.TCPSynSent)
	t.updateEpoll(f)
	t.markDirty(f)
	t.noteTimer(t.deadline(f))
	return true
}

// guestSynAck handles the guest's answer to our SYN. It reports whether the
// segment should go on to the established-state processing.
func (t *tcpTable) guestSynAck(now time.Time, f *tcpFlow, sg *tcpSegment) bool {
	if !sg.flags.Has(header.TCPFlagSYN|header.TCPFlagACK) || sg.ack != f.iss+1 || f.flags&flSynDue != 0 {
		return false
	}
	f.seqInitFromGuest = sg.seq
	f.ackBase = sg.seq + 1 // an accepted socket's tcpi_bytes_acked does not count the SYN
	f.seqFromGuest = sg.seq + 1
	f.seqAckToGuest = f.seqFromGuest
	mss := tcpMSSDefault
	if sg.opts.HasMSS && sg.opts.MSS > 0 {
		mss = int(sg.opts.MSS)
	}
	f.mssToGuest = max(min(mss, t.cfg.MTU-t.ipHdrLen(f.key.v6)-header.TCPMinimumSize), 64)
	if sg.opts.HasWindowScale {
		f.wsFromGuest = min(sg.opts.WindowScale, header.TCPMaxWindowScale)
	} else {
		f.wsFromGuest, f.wsToGuest = 0, 0
	}
	f.wndFromGuest = max(uint32(sg.wnd), 1)
	f.guestSACK = sg.opts.SACKPermitted
	t.establish(now, f)
	f.flags |= flAckDue // the handshake's third segment
	t.markDirty(f)
	return false
}

package tcp

import (
	"fmt"
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

// listener is an open forwarded port; fd -1: a free slot (the port was
// closed, and the slot is reused by the next Listen).
type listener struct {
	fd        int
	v6        bool
	guestPort uint16
	// masked: accept ran out of descriptors or memory, and the listener is
	// out of the epoll set's interest until acceptRetry or a closing
	// connection (accept_backoff.go).
	masked bool
}

// acceptBatch bounds accepts per event so a flood cannot starve the loop;
// edge-triggered epoll would not report the rest, so the listener is
// level-triggered.
const acceptBatch = 32

// SetGuest tells the table the guest's MAC and addresses, the destination
// of forwarded connections. Guest TCP frames also teach them.
func (t *Table) SetGuest(mac [6]byte, v4, v6 netip.Addr) {
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

// SetGuestDefaults tells the table the guest's MAC and addresses as
// configured (what DHCP and DHCPv6 hand out): forwarded connections go
// there until the guest's own traffic or SetGuest says otherwise.
func (t *Table) SetGuestDefaults(mac [6]byte, v4, v6 netip.Addr) {
	t.defaultMAC, t.defaultV4, t.defaultV6 = mac, v4, v6
}

// Guest returns the guest's MAC and addresses as learned (from its
// segments, or SetGuest); zero values for what is not known.
func (t *Table) Guest() (mac [6]byte, v4, v6 netip.Addr) {
	return t.guestMAC, t.guestV4, t.guestV6
}

// learnGuest notes the guest's MAC and address from a segment it sent.
func (t *Table) learnGuest(sg *segment) {
	t.guestMAC = sg.srcMAC
	if sg.src.Is4() {
		t.guestV4 = sg.src
	} else if !sg.src.IsLinkLocalUnicast() {
		t.guestV6 = sg.src
	}
}

// Listen opens a forwarded host port on addr (port 0: the kernel picks),
// restricted to interface iface when set, whose connections go to the
// guest's guestPort (0: the port bound). It returns the listener's slot,
// which Unlisten takes, and the port it listens on.
func (t *Table) Listen(addr netip.AddrPort, iface string, guestPort uint16) (slot int, port uint16, err error) {
	fd, port, err := hostsock.ListenTCP(addr, iface)
	if err != nil {
		return -1, 0, err
	}
	if guestPort == 0 {
		guestPort = port
	}
	i := t.listeners.Add(listener{fd: fd, v6: addr.Addr().Is6(), guestPort: guestPort})
	if t.poll != nil {
		if err := t.poll.Add(fd, unix.EPOLLIN, t.listenerToken(i)); err != nil {
			t.freeListener(i)
			return -1, 0, fmt.Errorf("forward epoll: %w", err)
		}
	}
	return i, port, nil
}

func (t *Table) listenerToken(i int) hostsock.Token {
	return hostsock.NewToken(hostsock.OwnerTCPListener, 0, uint32(i))
}

// NumListeners is the number of forwarded ports open.
func (t *Table) NumListeners() int { return t.listeners.Len() }

// Unlisten closes the forwarded port in slot: connections waiting in its
// backlog are reset by the kernel, connections accepted from it go on.
func (t *Table) Unlisten(slot int) error {
	if slot < 0 || slot >= len(t.listeners.All) || t.listeners.All[slot].fd < 0 {
		return fmt.Errorf("no forwarded port in slot %d", slot)
	}
	if t.poll != nil {
		_ = t.poll.Del(t.listeners.All[slot].fd)
	}
	t.freeListener(slot)
	return nil
}

// freeListener closes slot i's socket and makes the slot free.
func (t *Table) freeListener(i int) {
	unix.Close(t.listeners.All[i].fd)
	t.listeners.Free(i, listener{fd: -1})
}

// CloseListeners closes every forwarded port.
func (t *Table) CloseListeners() {
	for i := range t.listeners.All {
		if t.listeners.All[i].fd >= 0 {
			_ = t.Unlisten(i)
		}
	}
}

// accept takes the pending connections of listener i.
func (t *Table) accept(now time.Time, i int) {
	if i >= len(t.listeners.All) || t.listeners.All[i].fd < 0 {
		return
	}
	l := &t.listeners.All[i]
	for n := 0; n < acceptBatch; n++ {
		fd, peer, err := hostsock.Accept(l.fd)
		if err != nil {
			if acceptExhausted(err) {
				t.backOffAccept(now, i, err)
			}
			return // EAGAIN, or an error the next event retries
		}
		t.acceptDelay = 0
		if why, ok := t.inbound(now, fd, peer, l.guestPort); !ok {
			t.stats.AcceptRefusals[why].Add(1)
			hostsock.CloseWithReset(fd)
		}
	}
}

// inbound opens the guest side of an accepted connection, or says why not.
func (t *Table) inbound(now time.Time, fd int, peer netip.AddrPort, guestPort uint16) (stats.TCPReason, bool) {
	// A loopback peer appears as the gateway, which the guest answers.
	remote, _ := t.policy.Policy.InboundSource(peer.Addr())
	guest, mac := t.guestV4, t.guestMAC
	if remote.Is6() {
		guest = t.guestV6
	}
	if !guest.IsValid() {
		guest = t.defaultV4
		if remote.Is6() {
			guest = t.defaultV6
		}
	}
	if mac == ([6]byte{}) {
		mac = t.defaultMAC
	}
	if !guest.IsValid() || mac == ([6]byte{}) || !remote.IsValid() {
		t.log.Debug("tcp forward: guest address unknown, connection refused", "peer", peer)
		return stats.TCPGuestUnknown, false
	}
	key := connKey{guestAddr: guest.As16(), remoteAddr: remote.As16(), guestPort: guestPort,
		remotePort: peer.Port(), v6: guest.Is6()}
	if _, busy := t.byKey[key]; busy {
		return stats.TCPDuplicate, false
	}
	f := t.alloc(key)
	if f == nil {
		return stats.TCPTableFull, false
	}
	t.qstats.Flows.Opened[stats.FlowTCP].Add(1)
	t.stats.Accepted.Add(1)
	f.fd = fd
	f.sole = true // accept() made it
	f.guestMAC = mac
	f.guestAddr, f.remoteAddr = guest, remote
	f.guestPort, f.remotePort = guestPort, peer.Port()
	if peer.Addr().IsLoopback() {
		f.flags |= flLocal
	}
	hostsock.TuneTCP(fd, t.cfg.SndBuf, t.cfg.RcvBuf)
	f.mssToGuest = max(t.cfg.MTU-t.ipHdrLen(key.v6)-header.TCPMinimumSize, 64)
	f.wsToGuest = wsToGuestDefault // offered; dropped if the guest's SYN-ACK has none
	f.wndFromGuest = 1
	f.iss = t.newISS()
	f.seqToGuest, f.sndMax, f.seqAckFromGuest, f.recover, f.sackHigh = f.iss, f.iss, f.iss, f.iss, f.iss
	f.created, f.lastActivity, f.lastAckProg = now, now, now
	f.flags |= flConnected | flSynDue
	t.setState(f, stats.TCPSynSent)
	t.updateEpoll(f)
	t.markDirty(f)
	t.noteDeadline(f)
	return 0, true
}

// guestSynAck handles the guest's answer to our SYN. It reports whether the
// segment should go on to the established-state processing.
func (t *Table) guestSynAck(now time.Time, f *conn, sg *segment) bool {
	if !sg.flags.Has(header.TCPFlagSYN|header.TCPFlagACK) || sg.ack != f.iss+1 || f.flags&flSynDue != 0 {
		return false
	}
	f.ackBase = sg.seq + 1 // an accepted socket's tcpi_bytes_acked does not count the SYN
	t.takeGuestSyn(f, sg)
	t.establish(now, f)
	f.flags |= flAckDue // the handshake's third segment
	t.markDirty(f)
	return false
}

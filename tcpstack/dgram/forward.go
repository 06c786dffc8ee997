package dgram

import (
	"errors"
	"fmt"
	"net/netip"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"

	"golang.org/x/sys/unix"
)

// Inbound UDP forwarding (passt's -u): a host UDP socket bound to each
// forwarded port receives datagrams from host peers, which go to the guest
// from the peer's address (the gateway for loopback peers, which the guest
// cannot address) to the forward's guest port. The first datagram of a
// peer also opens a flow for it: a socket bound to the same local address
// and port (SO_REUSEADDR on both) and connected to the peer. The guest's
// replies leave through that socket, so the peer sees them come from the
// port it sent to, and the kernel prefers the connected socket for the
// peer's further datagrams, which then take the ordinary flow path.

// udpListener is one forwarded host UDP port; fd -1: a free slot (the
// port was closed, and the slot is reused by the next Listen).
type udpListener struct {
	fd        int
	v6        bool
	guestPort uint16
	iface     string
	local     unix.Sockaddr // bound address, shared by the peers' flow sockets
	pending   bool          // epoll reported input not read yet
}

// Listen opens a forwarded host UDP port on addr (port 0: the kernel
// picks), restricted to interface iface when set, whose datagrams go to the
// guest's guestPort (0: the port bound). It returns the port's slot, which
// CloseForward takes, and the port bound.
func (ft *Table) Listen(addr netip.AddrPort, iface string, guestPort uint16) (slot int, port uint16, err error) {
	fd, local, port, err := hostsock.ListenUDP(addr, iface)
	if err != nil {
		return -1, 0, err
	}
	if guestPort == 0 {
		guestPort = port
	}
	i := ft.fwd.Add(udpListener{fd: fd, v6: addr.Addr().Is6(), guestPort: guestPort, iface: iface, local: local})
	if ft.ep != nil {
		if err := ft.ep.Add(fd, unix.EPOLLIN|unix.EPOLLET, hostsock.NewToken(hostsock.OwnerUDPForward, 0, uint32(i))); err != nil {
			ft.freeForward(i)
			return -1, 0, fmt.Errorf("forward epoll: %w", err)
		}
	}
	ft.publishCapacity()
	return i, port, nil
}

// attachForwards registers the forwarded ports with a new loop's epoll set;
// datagrams may have arrived meanwhile, so each is read once.
func (ft *Table) attachForwards(ep *hostsock.Epoll) {
	for i := range ft.fwd.All {
		l := &ft.fwd.All[i]
		if l.fd < 0 {
			continue
		}
		if err := ep.Add(l.fd, unix.EPOLLIN|unix.EPOLLET, hostsock.NewToken(hostsock.OwnerUDPForward, 0, uint32(i))); err != nil {
			ft.log.Warn("register forwarded UDP port", "err", err)
			continue
		}
		l.pending = true
		ft.fwdPending = true
	}
}

// NumForwards is the number of forwarded ports open.
func (ft *Table) NumForwards() int { return ft.fwd.Len() }

// CloseForward closes the forwarded port in slot, and the flows opened for
// its peers (their sockets are bound to the port too, and would keep
// taking those peers' datagrams): the port is closed to everyone.
func (ft *Table) CloseForward(slot int) error {
	if slot < 0 || slot >= len(ft.fwd.All) || ft.fwd.All[slot].fd < 0 {
		return fmt.Errorf("no forwarded port in slot %d", slot)
	}
	for i := ft.lru[classInbound].head; i >= 0; {
		next := ft.flows[i].next
		if ft.flows[i].fwd == int32(slot) {
			ft.closeFlow(i)
		}
		i = next
	}
	ft.freeForward(slot) // closing the socket also leaves the epoll set
	ft.publishCapacity()
	return nil
}

// freeForward closes slot i's socket and makes the slot free.
func (ft *Table) freeForward(i int) {
	unix.Close(ft.fwd.All[i].fd)
	ft.fwd.Free(i, udpListener{fd: -1})
}

// CloseForwards closes every forwarded port.
func (ft *Table) CloseForwards() {
	for i := range ft.fwd.All {
		if ft.fwd.All[i].fd >= 0 {
			_ = ft.CloseForward(i)
		}
	}
}

// forwardReady handles an epoll event of a forwarded port.
func (ft *Table) forwardReady(tok hostsock.Token) {
	i := tok.Slot()
	if int(i) < len(ft.fwd.All) && ft.fwd.All[i].fd >= 0 {
		ft.fwd.All[i].pending = true
		ft.fwdPending = true
	}
}

// flushForwards reads the forwarded ports with input. blocked: the guest
// has no RX buffers, nothing else should try now.
func (ft *Table) flushForwards(w guestring.Sink) (more, blocked bool) {
	still := false
	for i := range ft.fwd.All {
		if !ft.fwd.All[i].pending || ft.fwd.All[i].fd < 0 {
			continue
		}
		switch ft.readForward(w, i) {
		case flowDrained:
			ft.fwd.All[i].pending = false
		case flowBudgetUsed:
			more, still = true, true
		case flowBlocked:
			return more, true // fwdPending stays set
		}
	}
	ft.fwdPending = still
	return more, false
}

// readForward moves datagrams from forwarded port i into guest RX buffers.
func (ft *Table) readForward(w guestring.Sink, i int) flowRead {
	lis := &ft.fwd.All[i]
	for b := 0; b < flowBudget; b++ {
		hdr, pay, r := ft.reserveDatagram(w, lis.fd, lis.v6)
		if r != datagramReserved {
			if r == datagramRetry {
				continue
			}
			return flowRead(r)
		}
		n, mflags, err := ft.io.RecvFrom(lis.fd, pay, &ft.fwdFrom)
		if err != nil {
			w.Abort()
			if errors.Is(err, unix.EAGAIN) {
				return flowDrained
			}
			continue
		}
		peer, ok := hostsock.RawAddrPort(&ft.fwdFrom)
		key, kok := ft.forwardKey(lis, peer)
		if mflags&unix.MSG_TRUNC != 0 || !ok || !kok {
			w.Abort()
			if mflags&unix.MSG_TRUNC != 0 {
				ft.st.UDPDrop(stats.ToGuest, stats.DropNoFit)
			} else {
				ft.st.UDPDrop(stats.ToGuest, stats.DropNoFlow)
			}
			continue
		}
		ft.commitDatagram(w, hdr, &key, pay, n)
		ft.forwardFlow(lis, i, &key, peer)
	}
	return flowBudgetUsed
}

// forwardKey is the flow key of a datagram from peer on lis, as the guest
// sees it: from the peer (the gateway for a loopback peer) to the guest's
// address and the forward's guest port.
func (ft *Table) forwardKey(lis *udpListener, peer netip.AddrPort) (flowKey, bool) {
	k := flowKey{kind: flowUDP, v6: lis.v6, guestPort: lis.guestPort, remotePort: peer.Port()}
	src, ok := ft.cfg.Policy.InboundSource(peer.Addr())
	if !ok {
		return k, false
	}
	dst := ft.cfg.Guest4
	if lis.v6 {
		dst = ft.cfg.Guest6
	}
	if !src.IsValid() || !dst.IsValid() || src.Is6() != lis.v6 || dst.Is6() != lis.v6 {
		return k, false
	}
	if lis.v6 {
		k.guestIP, k.remoteIP = dst.As16(), src.As16()
	} else {
		g, r := dst.As4(), src.As4()
		copy(k.guestIP[:], g[:])
		copy(k.remoteIP[:], r[:])
	}
	return k, true
}

// forwardFlow makes sure the guest's replies to peer have a flow leaving
// from the forwarded port (lis, in slot).
func (ft *Table) forwardFlow(lis *udpListener, slot int, key *flowKey, peer netip.AddrPort) {
	if i, ok := ft.byKey[*key]; ok {
		ft.touch(i)
		return
	}
	if ft.cfg.NoHostSockets {
		return
	}
	if ft.dir != nil && ft.dir.Held(keySum(ft.dir, key)) {
		return // the guest answers through another queue pair, which has the flow
	}
	// Peers pick their source ports at will: their flows have a quota of
	// their own and push out only each other, never the guest's (lru.go).
	ft.makeRoom(classInbound)
	fd, err := hostsock.DialUDPFrom(lis.local, peer, lis.iface)
	if err != nil {
		// The guest's replies then leave from another port; counted.
		ft.st.TX.Drops[stats.DropNoFlow].Add(1)
		if errors.Is(err, unix.EACCES) {
			// A port below net.ipv4.ip_unprivileged_port_start after
			// vunet's sandbox dropped CAP_NET_BIND_SERVICE (README
			// "Security"): say so rather than a bare EACCES.
			err = fmt.Errorf("%w: binding port %d needs CAP_NET_BIND_SERVICE, which vunet gave up after start-up; forward a host port at or above net.ipv4.ip_unprivileged_port_start to this guest port instead",
				err, sockaddrPort(lis.local))
		}
		ft.warn("cannot open reply socket for forwarded UDP peer", "peer", peer, "err", err)
		return
	}
	if i, ok := ft.adoptAs(key, fd, classInbound); ok {
		ft.flows[i].fwd = int32(slot)
	}
}

// sockaddrPort is the port of an IPv4 or IPv6 socket address.
func sockaddrPort(sa unix.Sockaddr) int {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return a.Port
	case *unix.SockaddrInet6:
		return a.Port
	}
	return 0
}

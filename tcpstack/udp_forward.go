package tcpstack

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

// udpListener is one forwarded host UDP port.
type udpListener struct {
	fd        int
	v6        bool
	guestPort uint16
	iface     string
	local     unix.Sockaddr // bound address, shared by the peers' flow sockets
	pending   bool          // epoll reported input not read yet
}

// listenUDP opens a forwarded host UDP port and returns the port bound.
func (ft *flowTable) listenUDP(fw Forward) (uint16, error) {
	addr := fw.HostAddr
	if !addr.IsValid() {
		addr = netip.IPv4Unspecified()
	}
	v6 := addr.Is6()
	fd, local, port, err := hostsock.ListenUDP(netip.AddrPortFrom(addr, fw.HostPort), fw.Iface)
	if err != nil {
		return 0, err
	}
	gp := fw.GuestPort
	if gp == 0 {
		gp = port
	}
	i := len(ft.fwd)
	ft.fwd = append(ft.fwd, udpListener{fd: fd, v6: v6, guestPort: gp, iface: fw.Iface, local: local})
	if ft.ep != nil {
		if err := ft.ep.Add(fd, unix.EPOLLIN|unix.EPOLLET, hostsock.NewToken(hostsock.OwnerUDPForward, 0, uint32(i))); err != nil {
			unix.Close(fd)
			ft.fwd = ft.fwd[:i]
			return 0, fmt.Errorf("forward epoll: %w", err)
		}
	}
	return port, nil
}

// attachForwards registers the forwarded ports with a new loop's epoll set;
// datagrams may have arrived meanwhile, so each is read once.
func (ft *flowTable) attachForwards(ep *hostsock.Epoll) {
	for i := range ft.fwd {
		l := &ft.fwd[i]
		if err := ep.Add(l.fd, unix.EPOLLIN|unix.EPOLLET, hostsock.NewToken(hostsock.OwnerUDPForward, 0, uint32(i))); err != nil {
			ft.log.Warn("register forwarded UDP port", "err", err)
			continue
		}
		l.pending = true
		ft.fwdPending = true
	}
}

// closeForwardsFrom closes the forwarded ports from index first on.
func (ft *flowTable) closeForwardsFrom(first int) {
	for _, l := range ft.fwd[first:] {
		unix.Close(l.fd)
	}
	ft.fwd = ft.fwd[:first]
}

// forwardReady handles an epoll event of a forwarded port.
func (ft *flowTable) forwardReady(tok hostsock.Token) {
	i := tok.Slot()
	if int(i) < len(ft.fwd) {
		ft.fwd[i].pending = true
		ft.fwdPending = true
	}
}

// flushForwards reads the forwarded ports with input. blocked: the guest
// has no RX buffers, nothing else should try now.
func (ft *flowTable) flushForwards(l *loop) (more, blocked bool) {
	still := false
	for i := range ft.fwd {
		if !ft.fwd[i].pending {
			continue
		}
		switch ft.readForward(l, i) {
		case flowDrained:
			ft.fwd[i].pending = false
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
func (ft *flowTable) readForward(l *loop, i int) flowRead {
	lis := &ft.fwd[i]
	w := &l.rx
	hl := ethHdrLen + ipv4HdrLen + udpHdrLen
	maxPay := maxUDPv4Pay
	if lis.v6 {
		hl = ethHdrLen + ipv6HdrLen + udpHdrLen
		maxPay = maxUDPv6Pay
	}
	for b := 0; b < flowBudget; b++ {
		if !w.Enabled() {
			return ft.discardAll(lis.fd)
		}
		hdr, pay, s := w.Reserve(hl, maxPay)
		plen := iovLen(pay)
		switch s {
		case guestring.OK:
		case guestring.NoFit, guestring.Broken:
			if _, _, err := ft.io.Recv(lis.fd, ft.discardIO[:], 0); err == nil {
				ft.st.UDPDrop(stats.ToGuest, stats.DropNoFit)
				continue
			}
			return flowDrained
		default:
			return flowBlocked
		}
		if plen < maxPay {
			if size, err := hostsock.NextDatagram(lis.fd); err == nil && size > plen {
				w.Abort()
				if w.MoreLater() {
					return flowBlocked
				}
				if _, _, err := ft.io.Recv(lis.fd, ft.discardIO[:], 0); err == nil {
					ft.st.UDPDrop(stats.ToGuest, stats.DropNoFit)
					continue
				}
				return flowDrained
			}
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
		vh := ft.buildUDPHeaders(l, hdr, &key, pay, n)
		w.Commit(n, &vh)
		ft.st.Proto.UDPDatagrams[stats.ToGuest].Add(1)
		ft.st.Proto.UDPBytes[stats.ToGuest].Add(uint64(n))
		ft.forwardFlow(lis, &key, peer)
	}
	return flowBudgetUsed
}

// forwardKey is the flow key of a datagram from peer on lis, as the guest
// sees it: from the peer (the gateway for a loopback peer) to the guest's
// address and the forward's guest port.
func (ft *flowTable) forwardKey(lis *udpListener, peer netip.AddrPort) (flowKey, bool) {
	k := flowKey{kind: flowUDP, v6: lis.v6, guestPort: lis.guestPort, remotePort: peer.Port()}
	src, ok := ft.cfg.policy.InboundSource(peer.Addr())
	if !ok {
		return k, false
	}
	dst := ft.cfg.guest4
	if lis.v6 {
		dst = ft.cfg.guest6
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
// from the forwarded port.
func (ft *flowTable) forwardFlow(lis *udpListener, key *flowKey, peer netip.AddrPort) {
	if i, ok := ft.byKey[*key]; ok {
		ft.flows[i].lastUsed = ft.now
		return
	}
	if ft.noSockets {
		return
	}
	if len(ft.free) == 0 {
		ft.evictOldest()
		ft.st.FlowsEvicted.Add(1)
	}
	fd, err := hostsock.DialUDPFrom(lis.local, peer, lis.iface)
	if err != nil {
		// The guest's replies then leave from another port; counted.
		ft.st.TX.Drops[stats.DropNoFlow].Add(1)
		ft.warn("cannot open reply socket for forwarded UDP peer", "peer", peer, "err", err)
		return
	}
	ft.adopt(key, fd)
}

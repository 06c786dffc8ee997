package dgram

import (
	"net/netip"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
)

// Flow slots: opening a flow (when the address policy allows it) takes a
// free slot of Table.flows, its class's list, the epoll set and the
// directory; closing one gives them back.

func (ft *Table) token(i int32) hostsock.Token {
	f := &ft.flows[i]
	o := hostsock.OwnerUDP
	if f.key.kind == flowICMP {
		o = hostsock.OwnerICMP
	}
	return hostsock.NewToken(o, f.gen, uint32(i))
}

// lookup returns the flow for key, opening its host socket when absent and
// the address policy allows it. A failure is counted as a TX drop and
// returned as why.
func (ft *Table) lookup(key *flowKey) (i int32, why stats.DropReason, ok bool) {
	if i, ok := ft.byKey[*key]; ok {
		ft.touch(i)
		return i, 0, true
	}
	if ft.dir != nil && ft.dir.Fetch(keySum(ft.dir, key)) {
		// Another queue pair holds it (the guest moved the socket to
		// another TX queue): the caller took the frame.
		return 0, dropTaken, false
	}
	proto := addrpolicy.UDP
	if key.kind == flowICMP {
		proto = addrpolicy.ICMP
	}
	v := ft.policy.Outbound(ft.now, proto, key.guestAddr(), netip.AddrPortFrom(key.remoteAddr(), key.remotePort))
	if !v.Allowed() {
		return 0, stats.DropPolicy, false
	}
	if ft.cfg.NoHostSockets {
		ft.st.TX.Drops[stats.DropNoFlow].Add(1)
		return 0, stats.DropNoFlow, false
	}
	if ft.makeRoom(classGuest) {
		// Full: the least recently used flow made room, so a guest that
		// touched many destinations is not locked out for a whole timeout.
		ft.warn("flow table full, oldest flow closed", "max", ft.cfg.MaxFlows)
	}
	var fd int
	var err error
	if key.kind == flowICMP {
		fd, err = ft.openICMP(key, v.Host)
	} else {
		fd, err = ft.openUDP(v.Host)
	}
	if err != nil {
		ft.st.TX.Drops[stats.DropNoFlow].Add(1)
		ft.warn("cannot open host socket for flow", "err", err, "kind", key.kind,
			"remote", key.remoteAddr(), "port", key.remotePort, "host", v.Host)
		return 0, stats.DropNoFlow, false
	}
	i, ok = ft.adopt(key, fd)
	if !ok {
		ft.st.TX.Drops[stats.DropNoFlow].Add(1)
		return 0, stats.DropNoFlow, false
	}
	ft.flows[i].dns = v.DNSForward
	return i, 0, true
}

// adopt makes fd, an open host socket, the guest's flow for key (see
// adoptAs).
func (ft *Table) adopt(key *flowKey, fd int) (int32, bool) { return ft.adoptAs(key, fd, classGuest) }

// dropTaken is lookup's "why" for a datagram the directory took (its flow
// is another pair's): not a drop, nothing to count.
const dropTaken = stats.NumDropReasons

// adoptAs makes fd, an open host socket, the flow for key in class c,
// counted as opened. The table must have a free slot. On failure fd is
// closed.
func (ft *Table) adoptAs(key *flowKey, fd int, c flowClass) (int32, bool) {
	i, ok := ft.place(key, fd, c)
	if !ok {
		unix.Close(fd)
		return 0, false
	}
	ft.st.Flows.Opened[key.kind.proto()].Add(1)
	return i, true
}

// place makes fd the flow for key in class c: a free slot, its class's
// list, the epoll set, the directory. The table must have a free slot. On
// failure (epoll refused it) fd is still the caller's.
func (ft *Table) place(key *flowKey, fd int, c flowClass) (int32, bool) {
	i := ft.free[len(ft.free)-1]
	ft.free = ft.free[:len(ft.free)-1]
	f := &ft.flows[i]
	f.key, f.fd, f.inUse, f.lastUsed, f.class, f.dns, f.fwd, f.hint, f.groSeg, f.gsoLimit = *key, fd, true, ft.now, c, false, -1, 0, 0, 0
	f.gen++
	// Counted before the registration, so that release undoes exactly
	// this when it fails.
	ft.lruAppend(i)
	ft.byKey[*key] = i
	if ft.dir != nil {
		f.fp = keySum(ft.dir, key)
		ft.dir.Add(f.fp)
	}
	ft.live++
	ft.st.Flows.Live[key.kind.proto()].Add(1)
	if key.kind == flowUDP {
		_ = hostsock.EnableGRO(fd) // readUDP splits what the kernel coalesced
		// The default buffer (rmem_default, 208 KiB) holds three 64 KiB
		// runs: a sender's burst longer than one loop wake-up would be
		// lost in it. The kernel clamps the ask to net.core.rmem_max
		// (no privilege needed below it); memory is taken only by what
		// waits.
		_ = hostsock.SetInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, udpRcvBuf)
	}
	if ft.ep != nil {
		if err := ft.ep.Add(fd, unix.EPOLLIN|unix.EPOLLET, ft.token(i)); err != nil {
			ft.warn("register flow socket", "err", err)
			ft.release(i)
			return 0, false
		}
	}
	if ft.nextSweep.IsZero() {
		ft.nextSweep = ft.now.Add(ft.sweepInterval())
	}
	return i, true
}

// closeFlow closes flow i's socket and frees its slot, counted as closed.
func (ft *Table) closeFlow(i int32) {
	f := &ft.flows[i]
	if !f.inUse {
		return
	}
	ft.flushSendsOf(i)
	unix.Close(f.fd) // also leaves the epoll set
	ft.st.Flows.Closed[f.key.kind.proto()].Add(1)
	ft.release(i)
}

// release frees flow i's slot; its socket is closed or someone else's now.
// Its queued datagrams go out first (closeFlow and Forget send them before
// they close the socket); those it received that wait for guest buffers
// are dropped, counted as DropFlowClosed.
func (ft *Table) release(i int32) {
	ft.flushSendsOf(i)
	f := &ft.flows[i]
	if rx := &ft.rx; rx.pNext < rx.pEnd && rx.pFlow == i && rx.pGen == f.gen {
		// Its datagrams waiting for guest buffers have no flow to go
		// out as any more.
		ft.dropPending(stats.DropFlowClosed)
	}
	f.fd = -1
	f.inUse = false
	ft.lruRemove(i)
	if j, ok := ft.byKey[f.key]; ok && j == i {
		delete(ft.byKey, f.key)
	}
	if ft.dir != nil {
		ft.dir.Remove(f.fp)
	}
	f.fp = 0
	ft.free = append(ft.free, i)
	ft.live--
	ft.st.Flows.Live[f.key.kind.proto()].Add(-1)
}

// proto is the flow counters' protocol of a flow kind.
func (k flowKind) proto() stats.FlowProto {
	if k == flowICMP {
		return stats.FlowICMP
	}
	return stats.FlowUDP
}

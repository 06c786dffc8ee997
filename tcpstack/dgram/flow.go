package dgram

import (
	"net/netip"
	"time"

	"vunet/tcpstack/header"
)

// flowKind says which translation a flow does.
type flowKind uint8

const (
	flowUDP  flowKind = iota + 1 // guest UDP 4-tuple ↔ connected host UDP socket
	flowICMP                     // guest echo id ↔ host ping socket
)

// flowKey identifies a flow by what the guest sees. IPv4 addresses use the
// first four bytes of the arrays.
type flowKey struct {
	kind                  flowKind
	v6                    bool
	guestIP, remoteIP     [16]byte
	guestPort, remotePort uint16 // ICMP: guestPort is the echo identifier
}

// packetKey is the key of the flow a guest packet belongs to: the guest's
// address is its source, the remote's its destination; guestPort is the
// echo identifier for ICMP.
func packetKey(kind flowKind, p *header.Packet, guestPort, remotePort uint16) flowKey {
	k := flowKey{kind: kind, v6: p.IsIPv6(), guestPort: guestPort, remotePort: remotePort}
	if k.v6 {
		k.guestIP, k.remoteIP = p.Src.As16(), p.Dst.As16()
	} else {
		s, d := p.Src.As4(), p.Dst.As4()
		copy(k.guestIP[:], s[:])
		copy(k.remoteIP[:], d[:])
	}
	return k
}

func (k *flowKey) guestAddr() netip.Addr  { return keyAddr(k.v6, &k.guestIP) }
func (k *flowKey) remoteAddr() netip.Addr { return keyAddr(k.v6, &k.remoteIP) }

func keyAddr(v6 bool, b *[16]byte) netip.Addr {
	if v6 {
		return netip.AddrFrom16(*b)
	}
	return netip.AddrFrom4([4]byte(b[:4]))
}

// flow is one slot of the flow table.
type flow struct {
	key      flowKey
	fd       int
	gen      uint32 // bumped on every reuse of the slot; part of the epoll token
	fp       uint64 // fingerprint in the directory (directory.go); 0: none
	inUse    bool
	queued   bool // in the ready list (may outlive the flow: skipped then)
	class    flowClass
	dns      bool  // a UDP flow to the DNS forward's resolver (counted per datagram)
	fwd      int32 // classInbound: the slot of the forwarded port it answers from; else -1
	lastUsed time.Time
	// hint is what a batch of received datagrams reserves for each
	// (udp_recv.go nextHint; 0: nothing received yet).
	hint int
	// groSeg is the segment size of the last run UDP_GRO coalesced on the
	// socket, while the flow's receives keep coming coalesced (0: the last
	// batch had none): with USO, the next receive reserves for a whole run.
	groSeg int
	// gsoLimit: guest datagrams go out in UDP_SEGMENT sends only when
	// smaller than it (0: any size); the kernel refused one of this size
	// (udp_send.go).
	gsoLimit int
	// prev and next link the flow into its class's LRU list (lru.go).
	prev, next int32
}

// gsoRefused reports whether the kernel refused UDP_SEGMENT sends of seg
// bytes a datagram on the flow (gsoLimit).
func (f *flow) gsoRefused(seg int) bool { return f.gsoLimit != 0 && seg >= f.gsoLimit }

// flowBudget bounds the datagrams one flow delivers per turn, so one busy
// socket cannot starve the others.
const flowBudget = 32

// flowRead is the outcome of reading one flow's socket.
type flowRead uint8

const (
	flowDrained    flowRead = iota // EAGAIN (or the socket failed): dequeue
	flowBudgetUsed                 // more data, let others go first
	flowBlocked                    // no RX buffer: keep queued, stop flushing
)

func (ft *Table) sweepInterval() time.Duration {
	d := min(ft.cfg.UDPTimeout, ft.cfg.ICMPTimeout) / 4
	return max(d, 10*time.Millisecond)
}

// NextDeadline is when Expire should run next; zero when no flow is open.
func (ft *Table) NextDeadline() time.Time {
	if ft.live == 0 {
		return time.Time{}
	}
	return ft.nextSweep
}

// Expire closes flows idle for longer than their timeout.
func (ft *Table) Expire(now time.Time) {
	ft.now = now
	if ft.live == 0 {
		ft.nextSweep = time.Time{}
		return
	}
	if now.Before(ft.nextSweep) {
		return
	}
	for i := range ft.flows {
		f := &ft.flows[i]
		if !f.inUse {
			continue
		}
		to := ft.cfg.UDPTimeout
		if f.key.kind == flowICMP {
			to = ft.cfg.ICMPTimeout
		}
		if now.Sub(f.lastUsed) >= to {
			ft.closeFlow(int32(i))
		}
	}
	ft.nextSweep = now.Add(ft.sweepInterval())
}

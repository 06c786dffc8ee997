package dgram

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/hostsock"
)

// Hand-over of flows to another Table, in another vunet on the same host,
// when QEMU live-migrates the guest (see tcpstack/tcp's handover.go, the
// same scheme): Export names each flow's socket and encodes its key, the
// other process imports the key with the same socket received over
// SCM_RIGHTS, and Forget then closes this table's descriptors only. A UDP
// flow keeps its host port, a ping flow its echo identifier: replies that
// were on their way reach the guest through the new table.

const flowStateVersion = 1

// flowWire is a flow's state on the wire (little-endian, encoding/binary).
type flowWire struct {
	Version    uint8
	Kind       uint8
	V6         bool
	Class      uint8 // flowClass: the guest's own, or a forwarded port's peer's
	GuestPort  uint16
	RemotePort uint16
	GuestIP    [16]byte
	RemoteIP   [16]byte
	LastUsed   int64 // age at the export, ns
}

var flowWireSize = binary.Size(flowWire{})

// StateSize is the length of a flow's state as HandOff and Export encode
// it.
const StateSize = 48

func init() {
	// Callers size their buffers by StateSize: a state cut short would
	// fail Import and lose the flow.
	if StateSize != flowWireSize {
		panic(fmt.Sprintf("dgram: StateSize %d, encoded flows are %d bytes", StateSize, flowWireSize))
	}
}

// Exported is one flow as Export hands it out.
type Exported struct {
	State []byte // for Import, in the other table
	FD    int    // the flow's host socket, still this table's
	slot  int32
	gen   uint32
}

// Export returns every open flow with its key encoded for Import. The
// table keeps them until Forget.
func (ft *Table) Export(now time.Time) []Exported {
	var out []Exported
	for i := range ft.flows {
		f := &ft.flows[i]
		if !f.inUse {
			continue
		}
		b, err := encodeFlow(now, f, make([]byte, 0, flowWireSize))
		if err != nil {
			continue
		}
		out = append(out, Exported{State: b, FD: f.fd, slot: int32(i), gen: f.gen})
	}
	return out
}

// encodeFlow appends f's state for Import to dst.
func encodeFlow(now time.Time, f *flow, dst []byte) ([]byte, error) {
	w := flowWire{Version: flowStateVersion, Kind: uint8(f.key.kind), V6: f.key.v6, Class: uint8(f.class),
		GuestPort: f.key.guestPort, RemotePort: f.key.remotePort,
		GuestIP: f.key.guestIP, RemoteIP: f.key.remoteIP, LastUsed: int64(now.Sub(f.lastUsed))}
	return binary.Append(dst, binary.LittleEndian, &w)
}

// Forget closes this table's descriptors of flows Export returned that
// another table took over, and frees their slots; a slot reused since is
// left alone. It returns how many were dropped.
func (ft *Table) Forget(ex []Exported) int {
	n := 0
	for _, e := range ex {
		if e.slot < 0 || int(e.slot) >= len(ft.flows) {
			continue
		}
		f := &ft.flows[e.slot]
		if !f.inUse || f.gen != e.gen || f.fd != e.FD {
			continue
		}
		ft.flushSendsOf(e.slot)
		unix.Close(f.fd)
		ft.release(e.slot)
		ft.st.Flows.MovedOut[f.key.kind.proto()].Add(1)
		n++
	}
	return n
}

// dnsForward reports whether the address policy sends a UDP flow of key
// to the DNS forward (a flow handed over keeps being counted as one).
func (ft *Table) dnsForward(key *flowKey) bool {
	if key.kind != flowUDP || ft.cfg.Policy == nil {
		return false
	}
	return ft.cfg.Policy.Outbound(addrpolicy.UDP, key.guestAddr(), netip.AddrPortFrom(key.remoteAddr(), key.remotePort)).DNSForward
}

// Errors of Import, matched with errors.Is.
var (
	ErrImportState = errors.New("flow hand-over: bad flow state")
	ErrImportTaken = errors.New("flow hand-over: flow exists or table full")
)

// Import adds a flow another table exported, with fd, the same host socket
// received from it (over SCM_RIGHTS from another vunet, or from another
// queue pair's HandOff). The state is checked like guest input and fd must
// be a UDP socket (a ping socket for an echo flow); on error fd is not
// taken. A detached table registers the socket at its next Attach, an
// attached one at once; either reads what arrived meanwhile.
func (ft *Table) Import(now time.Time, state []byte, fd int) error {
	var w flowWire
	if len(state) != flowWireSize {
		return fmt.Errorf("%d bytes, want %d: %w", len(state), flowWireSize, ErrImportState)
	}
	if _, err := binary.Decode(state, binary.LittleEndian, &w); err != nil {
		return fmt.Errorf("%w: %w", ErrImportState, err)
	}
	key := flowKey{kind: flowKind(w.Kind), v6: w.V6, guestIP: w.GuestIP, remoteIP: w.RemoteIP,
		guestPort: w.GuestPort, remotePort: w.RemotePort}
	if err := checkFlowWire(&w, &key); err != nil {
		return err
	}
	if err := checkDgramSocket(fd, key.kind); err != nil {
		return err
	}
	c := flowClass(w.Class)
	if len(ft.free) == 0 || ft.lru[c].n >= ft.quota(c) {
		return fmt.Errorf("table full: %w", ErrImportTaken)
	}
	if _, busy := ft.byKey[key]; busy {
		return fmt.Errorf("%v: %w", key.guestAddr(), ErrImportTaken)
	}
	ft.now = now
	i, ok := ft.place(&key, fd, c)
	if !ok {
		return fmt.Errorf("epoll: %w", ErrImportTaken)
	}
	a := min(max(w.LastUsed, 0), int64(math.MaxInt64/2))
	// Its place in the LRU list is the most recent: close enough for the
	// rare hand-over, whatever its age says.
	ft.flows[i].lastUsed = now.Add(-time.Duration(a))
	ft.flows[i].dns = ft.dnsForward(&key)
	ft.st.Flows.MovedIn[key.kind.proto()].Add(1)
	if ft.ep != nil {
		ft.enqueue(i) // datagrams may be queued already
	}
	return nil
}

func checkFlowWire(w *flowWire, key *flowKey) error {
	bad := func(what string, v any) error { return fmt.Errorf("%s %v: %w", what, v, ErrImportState) }
	switch {
	case w.Version != flowStateVersion:
		return bad("version", w.Version)
	case key.kind != flowUDP && key.kind != flowICMP:
		return bad("kind", w.Kind)
	case w.Class >= uint8(numClasses):
		return bad("class", w.Class)
	case key.kind == flowUDP && (w.GuestPort == 0 || w.RemotePort == 0):
		return bad("ports", [2]uint16{w.GuestPort, w.RemotePort})
	case key.kind == flowICMP && w.RemotePort != 0:
		return bad("echo flow port", w.RemotePort)
	}
	for _, b := range [][16]byte{w.GuestIP, w.RemoteIP} {
		if !w.V6 && [12]byte(b[4:]) != [12]byte{} {
			return bad("IPv4 address", b)
		}
	}
	if g, r := key.guestAddr(), key.remoteAddr(); g.IsUnspecified() || r.IsUnspecified() || g.IsMulticast() || g.Is4In6() || r.Is4In6() {
		return bad("addresses", [2]any{g, r})
	}
	return nil
}

// checkDgramSocket makes sure fd is what a flow of kind holds.
func checkDgramSocket(fd int, kind flowKind) error {
	if fd < 0 {
		return fmt.Errorf("no socket: %w", ErrImportState)
	}
	typ, proto, err := hostsock.SocketKind(fd)
	if err != nil {
		return fmt.Errorf("socket: %w: %w", ErrImportState, err)
	}
	want := proto == unix.IPPROTO_UDP
	if kind == flowICMP {
		want = proto == unix.IPPROTO_ICMP || proto == unix.IPPROTO_ICMPV6
	}
	if typ != unix.SOCK_DGRAM || !want {
		return fmt.Errorf("descriptor is not a %v socket (type %d, protocol %d): %w", kind, typ, proto, ErrImportState)
	}
	return nil
}

func (k flowKind) String() string {
	if k == flowICMP {
		return "ping"
	}
	return "UDP"
}

package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
)

// handOver moves every connection of h's table to a new harness, as two
// vunets do across a migration: Export with the table detached, the
// sockets duplicated (SCM_RIGHTS gives the other process a new descriptor
// of the same socket), Import there, Forget here. The guest's side of the
// harness (sequence numbers, window) goes with it: the guest migrated.
func (h *tcpHarness) handOver(cfg Config) *tcpHarness { return h.handOverTo(cfg, false) }

// handOverTo is handOver; detached imports as a migration destination
// does (tcpstack's importPending): into a table without a poller, which
// the pair's loop attaches later.
func (h *tcpHarness) handOverTo(cfg Config, detached bool) *tcpHarness {
	h.t.Helper()
	h.tab.Detach()
	ex := h.tab.Export(h.now)
	h2 := tcpNewHarness(h.t, cfg)
	h2.now = h.now.Add(3 * time.Second) // another process, another clock
	if detached {
		h2.tab.Detach()
		defer h2.tab.Attach(h2.poll)
	}
	for _, e := range ex {
		fd, err := unix.FcntlInt(uintptr(e.FD), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			h.t.Fatal(err)
		}
		if err := h2.tab.Import(h2.now, e.State, fd); err != nil {
			h.t.Fatalf("Import: %v", err)
		}
	}
	if n := h.tab.Forget(ex); n != len(ex) {
		h.t.Fatalf("Forget dropped %d of %d", n, len(ex))
	}
	h2.guest, h2.remote, h2.guestMAC = h.guest, h.remote, h.guestMAC
	h2.isn, h2.seq, h2.ack, h2.wnd, h2.ws = h.isn, h.seq, h.ack, h.wnd, h.ws
	return h2
}

// TestHandOverKeepsConnection moves a connection between two tables in the
// middle of traffic both ways, with data sent to the guest and not yet
// acknowledged: the host peer notices nothing, the guest's stream goes on
// with no byte lost, repeated or reordered, and the first table no longer
// holds the connection.
func TestHandOverKeepsConnection(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	start := h.flow().seqToGuest

	down := guestframe.Pattern(20000)
	peer.Write(down[:9000])
	h.waitQueued(9000)
	got := tcpPayloadOf(h.collect("first data", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= 9000 }))
	// The guest acknowledges only part: 5000 bytes stay in flight.
	h.ack = start + 4000
	h.sendAck([]byte("guest says hello "))
	h.flush()
	if q := h.queued(); q != 5000 {
		t.Fatalf("socket holds %d bytes, want the 5000 in flight", q)
	}

	h2 := h.handOver(Config{MTU: 1500})
	if h.tab.Len() != 0 || h.stats.ConnsByState[stats.TCPEstablished].Load() != 0 {
		t.Fatalf("source table still holds %d connections", h.tab.Len())
	}
	if h2.tab.Len() != 1 || h2.stats.ConnsByState[stats.TCPEstablished].Load() != 1 {
		t.Fatalf("destination table holds %d connections", h2.tab.Len())
	}
	f := h2.flow()
	if f == nil || f.seqToGuest != start+9000 || f.seqAckFromGuest != start+4000 {
		t.Fatalf("imported flow %+v", f)
	}

	// Both ways continue from the new table.
	peer.Write(down[9000:])
	h2.sendAck([]byte("and goodbye"))
	more := h2.collect("the rest", func(s []tcpSeg) bool { return len(tcpPayloadOf(s)) >= len(down)-9000 })
	if more[0].seq != start+9000 {
		t.Fatalf("the destination resent from %d, want %d", more[0].seq-start, 9000)
	}
	got = append(got, tcpPayloadOf(more)...)
	if !bytes.Equal(got, down) {
		t.Fatalf("the guest got %d bytes, differing from the %d the peer sent", len(got), len(down))
	}
	if up := tcpReadN(t, peer, len("guest says hello and goodbye")); string(up) != "guest says hello and goodbye" {
		t.Fatalf("peer got %q", up)
	}
	// The guest acknowledges everything: the socket drops it all.
	h2.ack = start + uint32(len(down))
	h2.sendAck(nil)
	h2.flush()
	if q := h2.queued(); q != 0 {
		t.Fatalf("%d bytes still queued after the final ACK", q)
	}
	// The peer closes: the FIN reaches the guest through the new table.
	peer.CloseWrite()
	fin := h2.collect("FIN", func(s []tcpSeg) bool {
		for _, x := range s {
			if x.flags&header.TCPFlagFIN != 0 {
				return true
			}
		}
		return false
	})
	if last := fin[len(fin)-1]; last.seq != start+uint32(len(down)) {
		t.Fatalf("FIN at %d, want %d", last.seq-start, len(down))
	}
}

// TestHandOverCoversEveryField: every field of a connection is either
// handed over or deliberately the receiving table's own. A field added to
// conn without a thought for the hand-over fails here.
func TestHandOverCoversEveryField(t *testing.T) {
	// The receiving table's own: its descriptor, slot and output list; the
	// key it derives from the addresses; its ring-budget sender period
	// (the connection counts as a sender there at its next write); its
	// challenge-ACK rate limit (at worst one more challenge ACK); its epoll
	// mask, which the importer derives from the state (epollWant).
	// The system-call hints, which start false there: one read, one
	// refresh (sendIdle, wndEdgeSpan), one getsockopt(SO_DOMAIN) or one EPOLL_CTL_DEL (sole)
	// more. And the loss recovery's soft state (sack_recovery.go, rto.go:
	// SACK view, tail-loss probe, round-trip estimate), rebuilt from the
	// guest's next ACKs: a recovery under way when the guest moved is left
	// to the ACK timeout, AckTimeout until a new sample. What a batch
	// acknowledged is consumed at its end, before any hand-over
	// (consume.go): consumeDue is 0 between batches; the same goes for a
	// mask change waiting for the iteration's end (epollDue, epoll.go).
	own := map[string]bool{"consumeDue": true, "epollDue": true, "wndEdgeSpan": true, "fd": true, "slot": true, "gen": true, "nextOut": true, "key": true, "senderPeriod": true,
		"challengeAt": true, "epollEvents": true, "drained": true, "urgent": true, "sendIdle": true, "dialled": true, "dialV6": true, "sole": true,
		"sackRecovery": true, "sackN": true, "sackBlk": true, "sackHigh": true, "rtxNext": true, "rtxMark": true,
		"tlp": true, "srtt": true, "rttvar": true, "rttAt": true, "rttSeq": true,
		// A delayed ACK: the importer's first output pass sends an ACK
		// that moved (TestTCPDelayedAck); a connection in an at-once
		// spell starts delaying again there, as new (spells of 2, 4...).
		"delAckAt": true, "delAckOff": true, "delAckProbe": true, "delAckRetry": true, "delAckSpell": true, "delAckTurn": true}
	now := time.Unix(2_000_000, 0)
	var f conn
	v := reflect.ValueOf(&f).Elem()
	for i := 0; i < v.NumField(); i++ {
		fv := v.Field(i)
		fv = reflect.NewAt(fv.Type(), fv.Addr().UnsafePointer()).Elem()
		switch fv.Kind() {
		case reflect.Uint8, reflect.Uint16, reflect.Uint32:
			fv.SetUint(uint64(i + 1))
		case reflect.Int, reflect.Int32, reflect.Int64:
			fv.SetInt(int64(1000 * (i + 1)))
		case reflect.Bool:
			fv.SetBool(true)
		}
		if fv.Type() == reflect.TypeOf(time.Time{}) {
			fv.Set(reflect.ValueOf(now.Add(-time.Duration(i) * time.Second)))
		}
	}
	// Values a real connection has.
	f.state, f.events, f.flags = stats.TCPEstablished, evSockRdHup, flLocal|flConnected|flAckDue
	f.guestAddr, f.remoteAddr = netip.MustParseAddr("10.0.2.15"), netip.MustParseAddr("10.0.2.2")
	f.mssToGuest, f.wsFromGuest, f.wsToGuest = 1400, 7, 8
	f.epollEvents, f.sndBuf, f.clamp = unix.EPOLLIN|unix.EPOLLET, 87380, 65535
	f.key = connKey{guestAddr: f.guestAddr.As16(), remoteAddr: f.remoteAddr.As16(), guestPort: f.guestPort, remotePort: f.remotePort}

	f.guestMAC = [6]byte{2, 0, 0, 0, 0, 9}
	src := New(Config{}, nil, nil)
	dst := New(Config{}, nil, nil)
	s, d := tcpSocketPair(t)
	defer unix.Close(d)
	// Whether a connection reads at SO_PEEK_OFF lives in its socket, as
	// the source table left it there.
	if f.peekOff = hostsock.PeekOffsetSupported(false); f.peekOff {
		if err := hostsock.SetPeekOffset(s, 0); err != nil {
			t.Fatal(err)
		}
	}
	slot := src.alloc(f.key)
	f.slot, f.gen, f.nextOut, f.fd = slot.slot, slot.gen, -1, s
	f.state = stats.TCPFree
	*slot = f
	src.setState(slot, stats.TCPEstablished)
	f.state = stats.TCPEstablished
	ex := src.Export(now)
	if len(ex) != 1 {
		t.Fatalf("%d exported", len(ex))
	}
	later := now.Add(time.Hour)
	dfd, err := unix.Dup(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.Import(later, ex[0].State, dfd); err != nil {
		t.Fatal(err)
	}
	g := &dst.flows[dst.byKey[f.key]]
	a, b := reflect.ValueOf(f), reflect.ValueOf(*g)
	for i := 0; i < a.NumField(); i++ {
		name := a.Type().Field(i).Name
		if own[name] {
			continue
		}
		x := reflect.NewAt(a.Field(i).Type(), reflect.ValueOf(&f).Elem().Field(i).Addr().UnsafePointer()).Elem().Interface()
		y := reflect.NewAt(b.Field(i).Type(), reflect.ValueOf(g).Elem().Field(i).Addr().UnsafePointer()).Elem().Interface()
		if tx, ok := x.(time.Time); ok {
			// Ages are kept: the time moved with the clock.
			if want := tx.Add(time.Hour); !y.(time.Time).Equal(want) {
				t.Errorf("%s: %v, want %v", name, y, want)
			}
			continue
		}
		if name == "flags" {
			x = x.(uint16) | flDirty // queued for the first output pass
		}
		if !reflect.DeepEqual(x, y) {
			t.Errorf("%s: %v after the hand-over, %v before", name, y, x)
		}
	}
	src.Forget(ex)
	dst.Forget(dst.Export(later))
}

// tcpSocketPair returns the two ends of a loopback TCP connection.
func tcpSocketPair(t testing.TB) (a, b int) {
	t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.DialTCP("tcp4", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	fdOf := func(c *net.TCPConn) int {
		f, err := c.File()
		if err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Dup(int(f.Fd()))
		f.Close()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	return fdOf(c), fdOf(s)
}

// TestImportHostile: states and descriptors another process could send
// that no connection has are refused, and the descriptor is not taken.
func TestImportHostile(t *testing.T) {
	h := tcpNewHarness(t, Config{MTU: 1500})
	ln := h.listen()
	h.establish(ln, tcpMss1400ws7)
	h.tab.Detach()
	good := h.tab.Export(h.now)[0].State
	mutate := func(fn func(w *connWire)) []byte {
		var w connWire
		if _, err := binaryDecode(good, &w); err != nil {
			t.Fatal(err)
		}
		fn(&w)
		return binaryEncode(t, &w)
	}
	a, b := tcpSocketPair(t)
	defer unix.Close(a)
	defer unix.Close(b)
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	udp, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(udp)
	lfd := tcpListenerFD(t)
	defer unix.Close(lfd)
	cases := []struct {
		name  string
		state []byte
		fd    int
		want  error
	}{
		{"short", good[:len(good)-1], a, ErrImportState},
		{"long", append(append([]byte(nil), good...), 0), a, ErrImportState},
		{"version", mutate(func(w *connWire) { w.Version = connStateVersion + 1 }), a, ErrImportState},
		{"free state", mutate(func(w *connWire) { w.State = 0 }), a, ErrImportState},
		{"unknown state", mutate(func(w *connWire) { w.State = 200 }), a, ErrImportState},
		{"unknown flags", mutate(func(w *connWire) { w.Flags = 0x8000 }), a, ErrImportState},
		{"dirty flag", mutate(func(w *connWire) { w.Flags |= flDirty }), a, ErrImportState},
		{"unknown events", mutate(func(w *connWire) { w.Events = 0x4000 }), a, ErrImportState},
		{"port 0", mutate(func(w *connWire) { w.GuestPort = 0 }), a, ErrImportState},
		{"mss 0", mutate(func(w *connWire) { w.MSSToGuest = 0 }), a, ErrImportState},
		{"mss huge", mutate(func(w *connWire) { w.MSSToGuest = 1 << 20 }), a, ErrImportState},
		{"window scale", mutate(func(w *connWire) { w.WsFrom = 15 }), a, ErrImportState},
		{"v4 flag on v6 address", mutate(func(w *connWire) { w.GuestAddr = netip.MustParseAddr("fd00::15").As16() }), a, ErrImportState},
		{"unspecified address", mutate(func(w *connWire) { w.RemoteAddr = netip.IPv4Unspecified().As16() }), a, ErrImportState},
		{"negative buffer", mutate(func(w *connWire) { w.SndBuf = -1 }), a, ErrImportState},
		{"epoll bits", mutate(func(w *connWire) { w.EpollEvents = unix.EPOLLONESHOT }), a, ErrImportState},
		{"no socket", good, -1, ErrImportState},
		{"pipe", good, pipe[0], ErrImportState},
		{"UDP socket", good, udp, ErrImportState},
		{"listening socket", good, lfd, ErrImportState},
		{"already there", good, a, ErrImportTaken},
	}
	for _, c := range cases {
		if err := h.tab.Import(h.now, c.state, c.fd); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// Nothing was taken: the descriptors are still ours and open.
	for _, fd := range []int{a, pipe[0], udp, lfd} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			t.Errorf("fd %d closed by a refused Import", fd)
		}
	}
	if h.tab.Len() != 1 {
		t.Errorf("%d connections after refused imports, want the 1 there was", h.tab.Len())
	}
}

func tcpListenerFD(t *testing.T) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 1); err != nil {
		t.Fatal(err)
	}
	return fd
}

// FuzzImport: any state bytes are refused or make a connection, never a
// panic; the table stays consistent either way.
func FuzzImport(f *testing.F) {
	h := tcpNewHarness(f, Config{MTU: 1500})
	ln := h.listen()
	h.establish(ln, tcpMss1400ws7)
	h.tab.Detach()
	f.Add(h.tab.Export(h.now)[0].State)
	f.Add(make([]byte, connWireSize))
	a, b := tcpSocketPair(f)
	f.Cleanup(func() { unix.Close(a); unix.Close(b) })
	f.Fuzz(func(t *testing.T, state []byte) {
		tab := New(Config{MTU: 1500, MaxFlows: 4}, nil, nil)
		fd, err := unix.Dup(a)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_000_000, 0)
		if err := tab.Import(now, state, fd); err != nil {
			unix.Close(fd)
			if tab.Len() != 0 {
				t.Fatal("a refused import left a connection")
			}
			return
		}
		// An imported connection goes through an output pass and the
		// timers without trouble, and leaves cleanly.
		tab.Flush(now, tcpNewFakeWriter(4))
		tab.Timers(now.Add(time.Hour))
		if n := tab.Forget(tab.Export(now)); n > 1 {
			t.Fatalf("forgot %d", n)
		}
		tab.ResetConnections()
	})
}

func binaryDecode(b []byte, w *connWire) (int, error) {
	return binary.Decode(b, binary.LittleEndian, w)
}

func binaryEncode(t *testing.T, w *connWire) []byte {
	t.Helper()
	b, err := binary.Append(nil, binary.LittleEndian, w)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

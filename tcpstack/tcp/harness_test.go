package tcp

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/addrpolicy"
	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/internal/guestframe"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// tcpFakeWriter is a guest RX ring with a configurable number of free
// descriptors, each bufSize bytes (headers included), optionally split into
// chunk-sized iovecs (MRG_RXBUF-like merged buffers).
type tcpFakeWriter struct {
	free    int
	bufSize int
	chunk   int
	pending []tcpFakeRes
	frames  []tcpFakeFrame
	aborts  int
}

type tcpFakeRes struct {
	buf    []byte
	hdrLen int
}

type tcpFakeFrame struct {
	b  []byte // Ethernet onward
	vh virtqueue.NetHdr
}

func tcpNewFakeWriter(free int) *tcpFakeWriter {
	return &tcpFakeWriter{free: free, bufSize: 70000}
}

func (w *tcpFakeWriter) Reserve(hdrLen, maxPayload int) ([]byte, [][]byte, guestring.Status) {
	if w.free == 0 {
		return nil, nil, guestring.NoDesc
	}
	w.free--
	n := min(maxPayload, w.bufSize-hdrLen)
	buf := make([]byte, hdrLen+n)
	w.pending = append(w.pending, tcpFakeRes{buf: buf, hdrLen: hdrLen})
	if n == 0 {
		return buf[:hdrLen], nil, guestring.OK
	}
	var pay [][]byte
	p := buf[hdrLen:]
	for len(p) > 0 {
		c := len(p)
		if w.chunk > 0 && c > w.chunk {
			c = w.chunk
		}
		pay = append(pay, p[:c])
		p = p[c:]
	}
	return buf[:hdrLen], pay, guestring.OK
}

func (w *tcpFakeWriter) Commit(payloadLen int, vh *virtqueue.NetHdr) {
	r := w.pending[0]
	w.pending = w.pending[1:]
	w.frames = append(w.frames, tcpFakeFrame{b: r.buf[:r.hdrLen+payloadLen], vh: *vh})
}

func (w *tcpFakeWriter) Abort() {
	w.free += len(w.pending)
	w.pending = nil
	w.aborts++
}

func (w *tcpFakeWriter) Enabled() bool   { return true }
func (w *tcpFakeWriter) Merging() bool   { return false }
func (w *tcpFakeWriter) MoreLater() bool { return false }

// take returns and forgets the committed frames.
func (w *tcpFakeWriter) take() []tcpFakeFrame {
	f := w.frames
	w.frames = nil
	return f
}

// tcpNewEpoll is the harness's epoll set, as a loop has one.
func tcpNewEpoll(t testing.TB) *hostsock.Epoll {
	ep, err := hostsock.NewEpoll()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	return ep
}

// tcpSeg is a parsed frame to the guest.
type tcpSeg struct {
	flags    header.TCPFlags
	seq, ack uint32
	wnd      uint16
	opts     header.TCPOptions
	payload  []byte
	vh       virtqueue.NetHdr
	csumOK   bool
	src, dst netip.AddrPort
}

// tcpHarness drives a Table as the loop would, with a simulated guest.
type tcpHarness struct {
	t      testing.TB
	tab    *Table
	poll   *hostsock.Epoll
	w      *tcpFakeWriter
	now    time.Time
	stats  *stats.TCP
	qstats *stats.Queue // the policy's drop counters

	guest, remote netip.AddrPort
	guestMAC      [6]byte
	isn           uint32 // guest ISN
	seq           uint32 // guest's next sequence
	ack           uint32 // guest's ACK (next byte expected from us)
	wnd           uint16
	ws            uint8
	blocked       bool
	batch         bool     // inject leaves guest data gathered until flushSends (send_gather.go)
	pending       [][]byte // guest memory of the frames injected since the last flushSends
}

// flushSends ends a TX batch as the loop does: the gathered guest data
// goes, and the frames' memory goes back to the guest, which is free to
// write over it (here: it is poisoned, so a late read sends wrong bytes).
func (h *tcpHarness) flushSends() {
	h.tab.FlushSends(h.now)
	for _, m := range h.pending {
		for i := range m {
			m[i] = 0xEE
		}
	}
	h.pending = h.pending[:0]
}

// tcpHarnessPolicy is the harness guest's address policy: the guest is
// 10.0.2.15/24 and fd00::15/64 behind 10.0.2.2, fe80::1 and fd00::2, all
// mapped to the host's loopback.
var tcpHarnessPolicy = addrpolicy.Config{
	Guest4:         netip.MustParsePrefix("10.0.2.15/24"),
	Guest6:         netip.MustParsePrefix("fd00::15/64"),
	LinkLocal6:     true,
	Gateway4:       netip.MustParseAddr("10.0.2.2"),
	Gateway6:       netip.MustParseAddr("fe80::1"),
	Gateway6Global: netip.MustParseAddr("fd00::2"),
	MapGateway:     true,
}

func tcpNewHarness(t testing.TB, cfg Config) *tcpHarness {
	t.Helper()
	h := &tcpHarness{
		t:        t,
		poll:     tcpNewEpoll(t),
		w:        tcpNewFakeWriter(1 << 20),
		now:      time.Unix(1_000_000, 0),
		stats:    new(stats.TCP),
		qstats:   new(stats.Queue),
		guest:    netip.MustParseAddrPort("10.0.2.15:40000"),
		guestMAC: [6]byte{0x52, 0x54, 0, 0x12, 0x34, 0x56},
		isn:      1_000_000,
		wnd:      65535,
	}
	if cfg.OurMAC == ([6]byte{}) {
		cfg.OurMAC = guestframe.OurMAC
	}
	if cfg.Policy == nil {
		cfg.Policy = addrpolicy.New(tcpHarnessPolicy)
	}
	h.tab = New(cfg, h.stats, h.qstats)
	h.tab.Attach(h.poll)
	t.Cleanup(h.tab.Close)
	return h
}

// frame builds a guest frame to h.remote.
func (h *tcpHarness) frame(fl header.TCPFlags, seq, ack uint32, wnd uint16, opts []byte, payload []byte) []byte {
	v6 := h.guest.Addr().Is6()
	ipLen := header.IPv4MinimumSize
	et := header.EtherTypeIPv4
	if v6 {
		ipLen, et = header.IPv6MinimumSize, header.EtherTypeIPv6
	}
	tcpLen := header.TCPMinimumSize + (len(opts)+3)/4*4
	b := make([]byte, header.EthernetMinimumSize+ipLen+tcpLen+len(payload))
	off := header.EncodeEthernet(b, header.MAC(guestframe.OurMAC), header.MAC(h.guestMAC), et)
	if v6 {
		off += header.EncodeIPv6(b[off:], &header.IPv6Fields{PayloadLength: uint16(tcpLen + len(payload)),
			NextHeader: header.IPProtocolTCP, HopLimit: 64, Source: h.guest.Addr(), Destination: h.remote.Addr()})
	} else {
		off += header.EncodeIPv4(b[off:], &header.IPv4Fields{TotalLength: uint16(ipLen + tcpLen + len(payload)),
			TTL: 64, Protocol: header.IPProtocolTCP, Source: h.guest.Addr(), Destination: h.remote.Addr()})
	}
	header.EncodeTCP(b[off:], &header.TCPFields{SrcPort: h.guest.Port(), DstPort: h.remote.Port(),
		SeqNum: seq, AckNum: ack, Flags: fl, WindowSize: wnd, Options: opts})
	copy(b[off+tcpLen:], payload)
	header.TCP(b[off:]).SetChecksum(h.guest.Addr(), h.remote.Addr())
	return b
}

// inject hands a frame to the table the way the TX path does: a copied
// head of at most 256 bytes, the payload from the "guest memory" iovec.
func (h *tcpHarness) inject(b []byte) {
	if !h.injectSplit(b, len(b)) {
		h.t.Fatalf("frame rejected")
	}
}

// injectSplit is inject with the frame's guest memory in two iovecs, split
// at split bytes into the frame (clamped to it); it reports whether the
// table took the frame.
func (h *tcpHarness) injectSplit(b []byte, split int) bool {
	head := make([]byte, min(len(b), 256))
	copy(head, b)
	// Guest memory with a virtio-net header in front, as in a TX chain.
	mem := append(make([]byte, virtqueue.NetHdrLen), b...)
	s := virtqueue.NetHdrLen + min(split, len(b))
	var p header.Packet
	if err := header.ParseFrame(head, len(b), &p); err != nil {
		h.t.Fatalf("frame does not parse: %v", err)
	}
	frame := [][]byte{mem[:s], mem[s:]}
	if s == len(mem) {
		frame = frame[:1]
	}
	ok := h.tab.HandleGuestFrame(h.now, &p, frame, virtqueue.NetHdrLen)
	h.pending = append(h.pending, mem)
	if !h.batch {
		h.flushSends() // each frame a TX batch of its own
	}
	return ok
}

func (h *tcpHarness) sendSYN(opts header.TCPOptions) {
	var ob [40]byte
	n := header.EncodeTCPOptions(ob[:], &opts)
	h.seq = h.isn + 1
	h.inject(h.frame(header.TCPFlagSYN, h.isn, 0, h.wnd, ob[:n], nil))
}

// sendAck sends an ACK (with optional payload) from the guest's state.
func (h *tcpHarness) sendAck(payload []byte) {
	h.inject(h.frame(header.TCPFlagACK, h.seq, h.ack, h.wnd, nil, payload))
	h.seq += uint32(len(payload))
}

func (h *tcpHarness) sendFin() {
	h.inject(h.frame(header.TCPFlagFIN|header.TCPFlagACK, h.seq, h.ack, h.wnd, nil, nil))
	h.seq++
}

// pump waits up to d for socket events, dispatches them, runs the output
// pass and returns the frames to the guest.
func (h *tcpHarness) pump(d time.Duration) []tcpSeg {
	h.t.Helper()
	var evs [32]unix.EpollEvent
	h.tab.SyncEpoll() // what the frames injected since the last pass changed
	n, err := h.poll.Wait(evs[:], int(d/time.Millisecond))
	if err != nil && !errors.Is(err, unix.EINTR) {
		h.t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		h.tab.HandleSocketEvent(h.now, hostsock.EventToken(&evs[i]), evs[i].Events)
	}
	return h.flush()
}

// pumpPayload pumps until n payload bytes reached the guest or d passed,
// and returns them (the guest sends no ACK meanwhile).
func (h *tcpHarness) pumpPayload(n int, d time.Duration) []byte {
	h.t.Helper()
	var got []byte
	for deadline := time.Now().Add(d); len(got) < n && time.Now().Before(deadline); {
		got = append(got, tcpPayloadOf(h.pump(50*time.Millisecond))...)
	}
	return got
}

// flush runs only the output pass, and ends the iteration as the loop
// does (SyncEpoll).
func (h *tcpHarness) flush() []tcpSeg {
	h.blocked = h.tab.Flush(h.now, h.w)
	h.tab.SyncEpoll()
	return h.parse(h.w.take())
}

func (h *tcpHarness) parse(frames []tcpFakeFrame) []tcpSeg {
	h.t.Helper()
	var out []tcpSeg
	for _, f := range frames {
		b := f.b
		eth, err := header.ParseEthernet(b)
		if err != nil {
			h.t.Fatalf("bad ethernet: %v", err)
		}
		if eth.Destination() != header.MAC(h.guestMAC) || eth.Source() != header.MAC(guestframe.OurMAC) {
			h.t.Fatalf("bad MACs %v %v", eth.Destination(), eth.Source())
		}
		var src, dst netip.Addr
		var l4 []byte
		if eth.Type() == header.EtherTypeIPv4 {
			ip, err := header.ParseIPv4(eth.Payload())
			if err != nil || !ip.IsChecksumValid() {
				h.t.Fatalf("bad ipv4: %v", err)
			}
			src, dst, l4 = ip.Source(), ip.Destination(), ip.Payload()
		} else {
			ip, err := header.ParseIPv6(eth.Payload())
			if err != nil {
				h.t.Fatalf("bad ipv6: %v", err)
			}
			src, dst, l4 = ip.Source(), ip.Destination(), ip.Payload()
		}
		th, err := header.ParseTCP(l4)
		if err != nil {
			h.t.Fatalf("bad tcp: %v", err)
		}
		s := tcpSeg{flags: th.Flags(), seq: th.SequenceNumber(), ack: th.AckNumber(), wnd: th.WindowSize(),
			payload: append([]byte(nil), th.Payload()...), vh: f.vh,
			src: netip.AddrPortFrom(src, th.SourcePort()), dst: netip.AddrPortFrom(dst, th.DestinationPort())}
		_ = header.ParseTCPOptions(th.Options(), &s.opts)
		if f.vh.Flags&virtqueue.NetHdrFNeedsCsum != 0 {
			// Complete the partial checksum as the guest would.
			c := make([]byte, len(l4))
			copy(c, l4)
			sum := header.Checksum(c, 0)
			binary.BigEndian.PutUint16(c[16:], ^sum)
			s.csumOK = header.TCP(c).IsChecksumValid(src, dst)
		} else {
			s.csumOK = th.IsChecksumValid(src, dst)
		}
		if !s.csumOK {
			h.t.Errorf("bad TCP checksum in frame seq %d", s.seq)
		}
		out = append(out, s)
	}
	return out
}

// listen returns a loopback listener and sets h.remote to reach it through
// the gateway address (mapped to 127.0.0.1).
func (h *tcpHarness) listen() *net.TCPListener {
	h.t.Helper()
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { ln.Close() })
	h.remote = netip.AddrPortFrom(netip.MustParseAddr("10.0.2.2"), uint16(ln.Addr().(*net.TCPAddr).Port))
	return ln
}

// setRcvBuf pins SO_RCVBUF on ln, inherited by accepted connections, so
// the peer's window is small from the handshake on.
func (h *tcpHarness) setRcvBuf(ln *net.TCPListener, n int) {
	h.t.Helper()
	rc, err := ln.SyscallConn()
	if err != nil {
		h.t.Fatal(err)
	}
	rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, n) })
}

// establish runs the handshake against ln and returns the accepted peer.
func (h *tcpHarness) establish(ln *net.TCPListener, opts header.TCPOptions) *net.TCPConn {
	h.t.Helper()
	h.sendSYN(opts)
	var synack []tcpSeg
	for i := 0; i < 100 && len(synack) == 0; i++ {
		synack = h.pump(20 * time.Millisecond)
	}
	if len(synack) != 1 || synack[0].flags != header.TCPFlagSYN|header.TCPFlagACK {
		h.t.Fatalf("want one SYN-ACK, got %+v", synack)
	}
	h.ack = synack[0].seq + 1
	if opts.HasWindowScale {
		h.ws = opts.WindowScale
	}
	h.sendAck(nil)
	peer, err := ln.AcceptTCP()
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { peer.Close() })
	if got := h.flow(); got == nil || got.state != stats.TCPEstablished {
		h.t.Fatalf("flow not established")
	}
	return peer
}

// flow returns the tcpHarness connection's flow.
func (h *tcpHarness) flow() *conn {
	k := connKey{guestAddr: h.guest.Addr().As16(), remoteAddr: h.remote.Addr().As16(),
		guestPort: h.guest.Port(), remotePort: h.remote.Port(), v6: h.guest.Addr().Is6()}
	s, ok := h.tab.byKey[k]
	if !ok {
		return nil
	}
	return &h.tab.flows[s]
}

// collect pumps until pred holds for the frames gathered so far, or fails.
func (h *tcpHarness) collect(what string, pred func([]tcpSeg) bool) []tcpSeg {
	h.t.Helper()
	var all []tcpSeg
	deadline := time.Now().Add(5 * time.Second)
	for !pred(all) {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s; got %d frames", what, len(all))
		}
		all = append(all, h.pump(10*time.Millisecond)...)
	}
	return all
}

// tcpPayloadOf concatenates the payload of data frames.
func tcpPayloadOf(ss []tcpSeg) []byte {
	var b []byte
	for _, s := range ss {
		b = append(b, s.payload...)
	}
	return b
}

func tcpReadN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("peer read: %v", err)
	}
	return b
}

var tcpMss1400ws7 = header.TCPOptions{HasMSS: true, MSS: 1400, HasWindowScale: true, WindowScale: 7}

// lagPeerAcks establishes a connection (AckOnPeerAck) to a host peer that
// does not read, and has the guest write 256 KiB into its small receive
// buffer, so that the ACKs to the guest, which follow what the peer
// acknowledged, lag what was written. It returns the harness, the
// connection, and the 16 KiB chunk the guest wrote.
func lagPeerAcks(t *testing.T) (*tcpHarness, *conn, []byte) {
	t.Helper()
	h := tcpNewHarness(t, Config{AckOnPeerAck: true})
	ln := h.listen()
	h.setRcvBuf(ln, 4096)
	h.establish(ln, tcpMss1400ws7)
	f := h.flow()
	h.flush()
	chunk := guestframe.Pattern(16384)
	for i := 0; i < 16; i++ {
		h.inject(h.frame(header.TCPFlagACK, f.seqFromGuest, h.ack, h.wnd, nil, chunk))
	}
	time.Sleep(50 * time.Millisecond)
	h.flush()
	if !seqLT(f.seqAckToGuest, f.seqFromGuest) {
		t.Fatalf("the peer acknowledged everything: nothing to test")
	}
	return h, f, chunk
}

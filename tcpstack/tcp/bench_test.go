package tcp

import (
	"bytes"
	"encoding/binary"
	"io"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// tcpRingWriter is an allocation-free frame writer over a fixed set of
// buffers, for benchmarks.
type tcpRingWriter struct {
	bufs    [][]byte
	pay     [1][]byte
	next    int
	pending int
	frames  int
	bytes   int
}

func newTCPRingWriter(n, size int) *tcpRingWriter {
	w := &tcpRingWriter{}
	for i := 0; i < n; i++ {
		w.bufs = append(w.bufs, make([]byte, size))
	}
	return w
}

func (w *tcpRingWriter) Reserve(hdrLen, maxPayload int) ([]byte, [][]byte, guestring.Status) {
	if w.pending == len(w.bufs) {
		return nil, nil, guestring.NoDesc
	}
	b := w.bufs[(w.next+w.pending)%len(w.bufs)]
	w.pending++
	w.pay[0] = b[hdrLen : hdrLen+min(maxPayload, len(b)-hdrLen)]
	if maxPayload == 0 {
		return b[:hdrLen], nil, guestring.OK
	}
	return b[:hdrLen], w.pay[:], guestring.OK
}

func (w *tcpRingWriter) Commit(n int, _ *virtqueue.NetHdr) {
	w.next = (w.next + 1) % len(w.bufs)
	w.pending--
	w.frames++
	w.bytes += n
}

func (w *tcpRingWriter) Abort()          { w.pending = 0 }
func (w *tcpRingWriter) Enabled() bool   { return true }
func (w *tcpRingWriter) Merging() bool   { return false }
func (w *tcpRingWriter) MoreLater() bool { return false }

// tcpBenchAck is a prebuilt guest ACK frame whose ACK number is patched in
// place, handed to the table without allocating.
type tcpBenchAck struct {
	frame, head []byte
	iov         [1][]byte
	ackOff      int
	pkt         header.Packet
}

func newTCPBenchAck(h *tcpHarness, payload []byte) *tcpBenchAck {
	fr := append(make([]byte, virtqueue.NetHdrLen), h.frame(header.TCPFlagACK, h.seq, h.ack, 65535, nil, payload)...)
	a := &tcpBenchAck{frame: fr, head: make([]byte, 256)}
	a.iov[0] = fr
	a.ackOff = virtqueue.NetHdrLen + header.EthernetMinimumSize + header.IPv4MinimumSize + 8
	return a
}

func (a *tcpBenchAck) send(h *tcpHarness, seq, ack uint32) {
	off := a.ackOff
	binary.BigEndian.PutUint32(a.frame[off-4:], seq)
	binary.BigEndian.PutUint32(a.frame[off:], ack)
	n := copy(a.head, a.frame[virtqueue.NetHdrLen:])
	// Parsed as the TX path does (its cost is part of the guest's ACK).
	if header.ParseFrame(a.head[:n], len(a.frame)-virtqueue.NetHdrLen, &a.pkt) != nil {
		panic("bench ACK does not parse")
	}
	h.tab.HandleGuestFrame(h.now, &a.pkt, a.iov[:], virtqueue.NetHdrLen)
	h.tab.FlushSends(h.now) // the TX batch ends: its data goes
}

// BenchmarkTCPHostToGuest: the host peer streams; each iteration is one
// output pass (peek into guest buffers, headers, commit) and one guest ACK
// (MSG_TRUNC). 0 allocs/op.
func BenchmarkTCPHostToGuest(b *testing.B) {
	h := tcpNewHarness(b, Config{MTU: 65520})
	h.tab.SetFeatures(true, true, true)
	ln := h.listen()
	peer := h.establish(ln, header.TCPOptions{HasMSS: true, MSS: 65480, HasWindowScale: true, WindowScale: 7})
	go func() {
		buf := make([]byte, 1<<20)
		for {
			if _, err := peer.Write(buf); err != nil {
				return
			}
		}
	}()
	f := h.flow()
	w := newTCPRingWriter(16, 65536+128)
	ack := newTCPBenchAck(h, nil)
	b.ReportAllocs()
	b.ResetTimer()
	tok := h.tab.token(f)
	for i := 0; i < b.N; i++ {
		// As if epoll reported new data each time.
		h.tab.HandleSocketEvent(h.now, tok, unix.EPOLLIN)
		h.tab.Flush(h.now, w)
		ack.send(h, f.seqFromGuest, f.seqToGuest)
	}
	b.StopTimer()
	b.SetBytes(int64(w.bytes / max(b.N, 1)))
	peer.Close()
}

// BenchmarkTCPGuestToHost: each iteration is one 1400-byte guest segment
// written to the host socket from "guest memory" and its ACK frame.
// 0 allocs/op.
func BenchmarkTCPGuestToHost(b *testing.B) {
	h := tcpNewHarness(b, Config{})
	ln := h.listen()
	peer := h.establish(ln, tcpMss1400ws7)
	go io.Copy(io.Discard, peer)
	f := h.flow()
	w := newTCPRingWriter(16, 2048)
	seg := newTCPBenchAck(h, make([]byte, 1400))
	h.tab.Flush(h.now, w)
	b.ReportAllocs()
	b.SetBytes(1400)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		seg.send(h, f.seqFromGuest, f.seqToGuest)
		h.tab.Flush(h.now, w)
	}
	b.StopTimer()
	peer.Close()
}

// tcpBenchSACK is a prebuilt guest ACK with one SACK block, its ACK number
// and block patched in place.
type tcpBenchSACK struct {
	tcpBenchAck
	blockOff int
}

func newTCPBenchSACK(h *tcpHarness) *tcpBenchSACK {
	o := header.TCPOptions{NumSACKBlocks: 1}
	o.SACKBlocks[0] = header.TCPSACKBlock{Start: 0x5a5a5a5a, End: 0xa5a5a5a5}
	var ob [40]byte
	n := header.EncodeTCPOptions(ob[:], &o)
	fr := append(make([]byte, virtqueue.NetHdrLen), h.frame(header.TCPFlagACK, h.seq, h.ack, 65535, ob[:n], nil)...)
	a := &tcpBenchSACK{tcpBenchAck: tcpBenchAck{frame: fr, head: make([]byte, 256)}}
	a.iov[0] = fr
	a.ackOff = virtqueue.NetHdrLen + header.EthernetMinimumSize + header.IPv4MinimumSize + 8
	a.blockOff = bytes.Index(fr, []byte{0x5a, 0x5a, 0x5a, 0x5a, 0xa5, 0xa5, 0xa5, 0xa5})
	return a
}

func (a *tcpBenchSACK) sendSACK(h *tcpHarness, seq, ack, start, end uint32) {
	binary.BigEndian.PutUint32(a.frame[a.blockOff:], start)
	binary.BigEndian.PutUint32(a.frame[a.blockOff+4:], end)
	// The checksum is not checked on the TX path's parse.
	a.send(h, seq, ack)
}

// BenchmarkTCPSACKRecovery: the host peer streams to a SACK guest; before
// each iteration (untimed) output passes send a flight of 4000 bytes or
// more; each iteration is the guest losing its first 1000 bytes: three
// ACKs at the hole SACKing more of the rest, the output pass that resends
// the hole (peeked at its offset), and the ACK of everything. 0 allocs/op.
func BenchmarkTCPSACKRecovery(b *testing.B) {
	h := tcpNewHarness(b, Config{MTU: 65520})
	h.tab.SetFeatures(true, true, true)
	ln := h.listen()
	peer := h.establish(ln, header.TCPOptions{HasMSS: true, MSS: 65480, HasWindowScale: true, WindowScale: 7, SACKPermitted: true})
	go func() {
		buf := make([]byte, 1<<20)
		for {
			if _, err := peer.Write(buf); err != nil {
				return
			}
		}
	}()
	f := h.flow()
	w := newTCPRingWriter(16, 65536+128)
	ack := newTCPBenchAck(h, nil)
	sack := newTCPBenchSACK(h)
	tok := h.tab.token(f)
	resent := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for f.sndMax-f.seqAckFromGuest < 4000 {
			runtime.Gosched()
			h.tab.HandleSocketEvent(h.now, tok, unix.EPOLLIN)
			h.tab.Flush(h.now, w)
		}
		b.StartTimer()
		una, end := f.seqAckFromGuest, f.sndMax
		for k := uint32(2); k <= 4; k++ {
			sack.sendSACK(h, f.seqFromGuest, una, una+1000, end-(4-k)*1000)
		}
		h.tab.Flush(h.now, w)
		if f.sackRecovery && f.rtxNext == una+1000 {
			resent++
		}
		ack.send(h, f.seqFromGuest, end)
	}
	b.StopTimer()
	if resent != b.N || h.stats.Retransmits[stats.TCPRetransSACK].Load() != uint64(b.N) {
		b.Fatalf("%d holes resent, %d recoveries in %d iterations", resent, h.stats.Retransmits[stats.TCPRetransSACK].Load(), b.N)
	}
	peer.Close()
}

// BenchmarkTCPConnect: each iteration is one connection the guest opens to
// a loopback listener and resets: the SYN (socket, connect, the
// connection's slot, its directory entry), the SYN-ACK (in the SYN's pass
// or after the socket's event), and the guest's RST (the socket aborted,
// the slot freed). What a connection costs the table before any data,
// and that it costs no allocation. The listener's side accepts and closes
// with raw system calls, which allocate nothing either.
func BenchmarkTCPConnect(b *testing.B) {
	h := tcpNewHarness(b, Config{})
	ln := h.listen()
	rc, err := ln.SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	var lfd int
	rc.Control(func(fd uintptr) { lfd = int(fd) })
	go func() {
		for {
			// A blocking accept on the listener's descriptor, no address.
			c, _, errno := unix.Syscall6(unix.SYS_ACCEPT4, uintptr(lfd), 0, 0, unix.SOCK_CLOEXEC, 0, 0)
			if errno == unix.EAGAIN {
				var pfd [1]unix.PollFd
				pfd[0] = unix.PollFd{Fd: int32(lfd), Events: unix.POLLIN}
				if _, err := unix.Poll(pfd[:], 1000); err != nil && err != unix.EINTR {
					return
				}
				continue
			}
			if errno != 0 {
				return // the listener closed
			}
			unix.Close(int(c))
		}
	}()
	var ob [40]byte
	n := header.EncodeTCPOptions(ob[:], &tcpMss1400ws7)
	syn := newTCPBenchFrame(h.frame(header.TCPFlagSYN, h.isn, 0, h.wnd, ob[:n], nil))
	rst := newTCPBenchFrame(h.frame(header.TCPFlagRST, h.isn+1, 0, 0, nil, nil))
	w := newTCPRingWriter(4, 2048)
	var evs [8]unix.EpollEvent
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		port := uint16(10000 + i%50000)
		syn.send(h, port)
		for w.frames == i {
			h.tab.Flush(h.now, w)
			if w.frames > i {
				break
			}
			n, err := h.poll.Wait(evs[:], 1000)
			if err != nil && err != unix.EINTR {
				b.Fatal(err)
			}
			if n == 0 {
				b.Fatalf("connection %d: no SYN-ACK in 1 s", i)
			}
			for j := 0; j < n; j++ {
				h.tab.HandleSocketEvent(h.now, hostsock.EventToken(&evs[j]), evs[j].Events)
			}
		}
		rst.send(h, port)
		if h.tab.Len() != 0 {
			b.Fatalf("connection %d still in the table after the guest's RST", i)
		}
	}
	b.StopTimer()
	if w.frames != b.N {
		b.Fatalf("%d frames to the guest for %d connections, want one SYN-ACK each", w.frames, b.N)
	}
}

// tcpBenchFrame is a prebuilt guest frame whose source port is patched in
// place, handed to the table without allocating (the TX path's parse does
// not check the checksum).
type tcpBenchFrame struct {
	frame, head []byte
	iov         [1][]byte
	portOff     int
	pkt         header.Packet
}

func newTCPBenchFrame(eth []byte) *tcpBenchFrame {
	fr := append(make([]byte, virtqueue.NetHdrLen), eth...)
	f := &tcpBenchFrame{frame: fr, head: make([]byte, 256)}
	f.iov[0] = fr
	f.portOff = virtqueue.NetHdrLen + header.EthernetMinimumSize + header.IPv4MinimumSize
	return f
}

func (f *tcpBenchFrame) send(h *tcpHarness, srcPort uint16) {
	binary.BigEndian.PutUint16(f.frame[f.portOff:], srcPort)
	n := copy(f.head, f.frame[virtqueue.NetHdrLen:])
	if header.ParseFrame(f.head[:n], len(f.frame)-virtqueue.NetHdrLen, &f.pkt) != nil {
		panic("bench frame does not parse")
	}
	h.tab.HandleGuestFrame(h.now, &f.pkt, f.iov[:], virtqueue.NetHdrLen)
	h.tab.FlushSends(h.now)
}

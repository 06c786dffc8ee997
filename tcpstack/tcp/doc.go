package tcp

// TCP translation: how the event loop plugs it in.
//
// Table (tcp_table.go) holds one queue pair's TCP connections: a fixed
// array of cfg.MaxFlows slots, a map from the guest-side 4-tuple to a slot,
// no goroutine per connection and no locks; only the pair's loop goroutine
// touches it. Counters are in stats.TCP (atomics, for metrics). A guest TCP
// connection becomes a host connect()ed socket; there is no TCP stack here.
//
// The loop owns (and implements) two small interfaces:
//
//	type tcpPoller interface {            // the loop's epoll set
//		Add(fd int, events uint32, token uint64) error
//		Mod(fd int, events uint32, token uint64) error
//		Del(fd int) error
//	}
//	type tcpFrameWriter interface {       // the RX path, reserving guest RX chains
//		Reserve(hdrLen, maxPayload int) (hdr []byte, payload [][]byte, ok bool)
//		Commit(payloadLen int, vh *virtqueue.NetHdr)
//		Abort()
//	}
//
// and calls:
//
//	t := New(cfg Config, stats *stats.TCP, p tcpPoller) // once per pair index; keep it across restarts
//	t.Attach(p tcpPoller)                        // after StartPair built a new epoll set: re-registers all sockets
//	t.Detach()                                   // when the loop stops, before its epoll set is closed
//	t.SetGuest(mac [6]byte, v4, v6 netip.Addr)   // guest MAC/addresses for forwarded connections (also learned from frames)
//	t.Listen(fw TCPForward) (port uint16, err error) // open a forwarded host port (inbound connections)
//	t.SetFeatures(guestCsum, tso4, tso6 bool)    // from the negotiated VIRTIO_NET_F_GUEST_CSUM/TSO4/TSO6
//	t.SetMTU(mtu int)
//	t.HandleGuestFrame(now, head []byte, frame [][]byte, skip, frameLen int) bool
//	t.HandleSocketEvent(now, token uint64, events uint32)
//	t.Flush(now, w tcpFrameWriter) (blocked bool)
//	t.Timers(now) (next time.Time)
//	t.NextTimer() time.Time
//	t.Close()                                    // final shutdown: RST to every host peer
//
// Wiring, in the loop's iteration:
//
//  1. TX path, for an IPv4/IPv6 frame whose protocol is TCP:
//     t.HandleGuestFrame(now, head, chain.Readable, netHdrLen, frameLen).
//     head is the TX path's copy of the frame's first bytes (Ethernet on);
//     payload is written to the host socket with sendmsg straight from the
//     chain's guest memory, so the chain must not be pushed back to the
//     guest before HandleGuestFrame returns (it is not kept after).
//     false means malformed: count stats.DropMalformed.
//  2. epoll: events whose token has bits 56–63 == cfg.TokenTag go to
//     t.HandleSocketEvent(now, token, events). The token is a uint64; with
//     unix.EpollEvent keep it as Fd = low 32 bits, Pad = high 32 bits.
//  3. timerfd: t.Timers(now).
//  4. Last in every iteration (and after an RX kick): if t.Flush(now, w)
//     reports blocked, enable RX kicks and call Flush again when the guest
//     posts buffers; nothing else retries it (frame accounting, DESIGN
//     invariant 1). Then publish the RX batch.
//  5. Arm the timerfd to t.NextTimer() if it changed (zero: disarm).
//
// Frame writer contract: Reserve takes guest RX buffers for one frame,
// hdrLen contiguous header bytes (Ethernet on; the writer owns the virtio-net
// header) plus up to maxPayload bytes of payload as guest-memory iovecs.
// Several reservations may be outstanding; Commit publishes the oldest with
// its payload length and the checksum/GSO fields of vh (the writer fills in
// NumBuffers); Abort rewinds all uncommitted ones (virtqueue Unpop). Socket
// data is peeked (MSG_PEEK, at SO_PEEK_OFF) straight into the reserved
// payload buffers, and the sequence to the guest advances only on Commit.
//
// Epoll: connected sockets are registered edge-triggered (see updateEpoll);
// a socket still connecting waits for EPOLLOUT. Forwarded-port listeners
// (Listen) are level-triggered and carry the same tag, with bit 31 of the
// slot set; HandleSocketEvent dispatches both. Listen on one pair's table
// only (a second bind of the same port fails): accepted connections answer
// through that pair's RX ring, which any guest queue setup accepts.

// Package tcp translates the guest's TCP connections into host TCP sockets,
// with no TCP stack of its own: the host kernel keeps doing congestion
// control, retransmission towards the remote peer and buffering; this
// package moves bytes between guest segments and the socket and keeps the
// guest's view of the connection (sequence numbers, windows, handshake and
// close) consistent with the socket's (passt's model, DESIGN invariants
// 1–8).
//
// A Table holds one queue pair's connections: a fixed array of
// Config.MaxFlows slots, a map from the guest-side 4-tuple to a slot, no
// goroutine per connection and no locks; only the pair's loop goroutine
// touches it. Counters are stats.TCP (atomics, for metrics). It outlives the
// pair's loops: Attach registers its sockets with a new loop's epoll set,
// Detach forgets the old one. A connection whose segments the guest sends
// on another pair's TX queue moves to that pair's table (directory.go:
// the tables publish their connections in a Directory, a segment without a
// connection asks it before it is reset, HandOff and Import move it).
//
// The loop calls:
//
//	t := tcp.New(cfg, tcpStats, queueStats)   // once per pair; keep it across restarts
//	t.Attach(ep) / t.Detach()                 // around each loop's life
//	t.SetGuest(mac, v4, v6)                   // guest MAC/addresses for forwarded connections
//	t.Listen(addr, iface, guestPort)          // a forwarded host port (passt's -t): its slot
//	t.Unlisten(slot)                          // close it (at run time too)
//	t.SetFeatures(guestCsum, tso4, tso6)      // negotiated GUEST_CSUM/TSO4/TSO6
//	t.SetMTU(mtu)
//	t.HandleGuestFrame(now, p, frame, skip)   // a guest segment (false: malformed, count it)
//	t.FlushSends(now) / t.DropSends()         // end of a TX batch: write the gathered guest data / forget it
//	t.HandleSocketEvent(now, token, events)   // epoll: hostsock.OwnerTCP and OwnerTCPListener
//	t.Flush(now, sink) (blocked bool)         // the output pass, last in every iteration
//	t.SyncEpoll()                             // the iteration's end: the sockets' final epoll masks
//	t.Timers(now); t.NextTimer()              // the wait's timeout
//	t.SetDirectory(d)                         // share the connections with the other pairs' tables
//	t.HandOff(now, fp) / t.Import(now, st, fd) // move a connection to another pair's table
//	t.ResetConnections() / t.Close()          // the guest left / the Stack closes: RST to host peers
//
// Guest → host (input.go): HandleGuestFrame takes the frame's Packet
// (header.ParseFrame, run once by the TX path on a copy of the frame's
// first bytes) and the frame's guest memory; a segment without a
// connection asks the address policy (stats.PolicyGate) and opens one
// (handshake.go: the host connect() first, the SYN-ACK to the guest only
// once it completed); payload goes to the socket with sendmsg straight from
// guest memory (hostsock.IO), the in-order segments of a connection that
// follow each other gathered into one write (send_gather.go), so the chain
// must not go back to the guest, nor its buffer be reused, before
// FlushSends.
//
// Host → guest (output.go, send.go, frame.go): events and ACKs only mark
// connections dirty; Flush serves them in one ordered pass per connection
// (data, then FIN, then ACK/window update, so a flag never overtakes
// data). Data is peeked (MSG_PEEK at SO_PEEK_OFF, or past a discard buffer
// without it) straight into guest buffers reserved from a guestring.Sink,
// headers are built in place, and the sequence to the guest advances only
// by what is committed. If the guest has no buffers, Flush reports blocked
// and the loop calls it again on the guest's refill kick; nothing else
// retries it. The window the guest is offered follows the socket's send
// side (window.go); timers run from timestamps kept per connection
// (timers.go). Frames lost on the way to the guest are sent again from the
// socket, where they stay until ACKed: with SACK, only the holes the
// guest's SACK blocks show, peeked at their offset (sack_recovery.go,
// with a tail-loss probe); without, from its ACK on (window.go: rewind);
// at the latest at an ACK timeout that follows the measured round trip
// (rto.go).
//
// Epoll: connected sockets are registered edge-triggered (updateEpoll says
// why), a socket still connecting waits for EPOLLOUT, forwarded-port
// listeners are level-triggered (inbound.go). Listen on one pair's table
// only (a second bind of the port fails): accepted connections answer
// through that pair's RX ring, which any guest queue setup accepts.
//
// The package imports guestring, hostsock, header, stats, addrpolicy and
// virtqueue of vunet's; never the datagram flows or the link services.
package tcp

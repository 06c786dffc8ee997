// Package tcpstack is vunet's translation core: it turns the guest's Ethernet
// frames into operations on native host sockets and host socket data back into
// frames, without a TCP/IP stack of its own (the host kernel keeps doing
// congestion control, retransmission and buffering, as with passt).
//
// # Layout
//
// The root package is the data plane the control plane drives: [Stack]
// (per queue pair: start, stop, the session's end), its [Config], the
// forwarded ports ([Open]), and the per-pair event loop that dispatches
// every guest frame once parsed. The ideas live in packages of their own,
// with walls between them (imports go one way; walls_test.go enforces it):
//
//	tcpstack            Stack, config, forwards; the loop (loop.go), TX batch and dispatch (tx.go),
//	                    frames for the guest (rx.go), link-service replies (replies.go),
//	                    IP reassembly (reassembly.go), the loop's end (shutdown.go),
//	                    flows moving between pairs (moves.go, mailbox.go)
//	tcpstack/tcp        TCP translation: connection table, handshake, input, window policy,
//	                    output pass, data to the guest, frame building, timers, forwarded ports
//	tcpstack/dgram      UDP flows, ICMP echo (ping sockets), forwarded UDP ports
//	tcpstack/linksvc    ARP, DHCP, DHCPv6, NDP/RA answered by us; AddrConfig and host defaults
//	tcpstack/guestring  the RX writer (Reserve/Commit/Abort into guest buffers, a Sink), capture
//	tcpstack/stream     QEMU's -netdev stream framing: frames off the socket, a Sink into its send buffer
//	tcpstack/hostsock   the one host-socket syscall layer, the epoll set and its one token type
//	tcpstack/addrpolicy the address policy: what the guest may reach and where it really goes
//	tcpstack/stats      the counters metrics exports, the log rate limiter, the policy gate
//	tcpstack/flowdir    the directory of flows across queue pairs, read without locks
//	tcpstack/header     wire formats: ParseFrame (the one parse), builders, checksums
//
// The root imports all of them and nothing imports the root. stream
// imports guestring, hostsock, stats and virtqueue. tcp and dgram
// import guestring, hostsock, header, stats, addrpolicy and virtqueue, never
// each other nor linksvc nor flowdir (they see it through a Directory
// interface of their own); linksvc imports only header; guestring imports
// stats, header and virtqueue; stats imports addrpolicy (the policy gate
// asks the policy and counts its refusals by reason); the rest import
// nothing of vunet's.
//
// # The loop
//
// Each virtio-net queue pair is served by one event loop, a goroutine that
// holds a P of its own (GOMAXPROCS is the number of loops; loop_wait.go says
// why and how the rest of the process gets to run). The loop waits in epoll
// on the TX and RX kick eventfds, a wake eventfd for requests from the
// control goroutine (loop_requests.go: a forward added at run time, a look
// at the tables), the vhost-user socket (only to yield to the control
// plane) and the flows' sockets; each fd's epoll token (hostsock.Token)
// names its owner, and the loop hands the event to it. Its timers are the
// wait's timeout (a timerfd only ticks the rings of a front-end that gave
// no kick eventfds). The hot path takes no locks, uses no
// channels and does not allocate. Flows and connections outlive the loops:
// they survive the control plane's stop/start cycles and re-register their
// sockets with each new loop's epoll set.
//
// # Flows across queue pairs
//
// A flow belongs to the guest, not to a queue pair: its frames may come on
// any TX queue (a Linux guest re-picks a socket's queue when the sending
// thread moves to another vCPU). Each pair's tables hold the flows whose
// frames last came on its TX queue, and a flow moves, whole, to the pair
// whose TX queue its next frame came on (moves.go); its frames to the
// guest go out on the RX queue of the pair that holds it, so on one RX
// queue at a time, and in order across a move (the old holder publishes
// its RX ring before it lets go). How it stays off the per-frame path, and
// lock-free:
//
//   - A frame whose flow is in the pair's own table never looks further:
//     the per-frame path is one map lookup in tables only this loop
//     touches, as before.
//   - Only a miss asks the directory (tcpstack/flowdir): per pair a set of
//     key fingerprints in atomics, written by that pair's loop alone when
//     a flow opens, moves or closes, read by any loop without a lock (a
//     sequence count makes a reader retry a probe that a removal
//     overlapped). A flow no pair holds is unknown as before (an RST, a new
//     socket); a flow another pair holds is fetched.
//   - Fetching is a hand-over between loops through per-pair mailboxes
//     (bounded lock-free queues and an eventfd): the asking loop claims
//     the flow in its shard, asks, and keeps the frame's TX chain popped
//     (the chains behind it wait too, so the guest's order holds; every
//     chain goes back on its own TX queue). The holder, after its own TX
//     work, gives the flow away — the live-migration encoding
//     (tcp.Table.HandOff, dgram.Table.HandOff) and the same open socket —
//     and the asking loop imports it and handles the frame. No loop ever
//     touches another's tables.
//   - A frame waits at most 200 ms (a holder whose loop is stopped for a
//     ring change); then it is dropped, counted (DropFlowMoving), and the
//     guest's retransmission tries again.
//
// # A guest TCP segment, TX kick to sendmsg (four files)
//
//	loop.go            run: epoll_wait returns the TX kick; iterate calls processTX
//	tx.go              txBatch pops the chains; handleTXFrame copies the frame's first
//	                   bytes out of guest memory, parses them once (header.ParseFrame)
//	                   and dispatches the Packet: dispatchIP, dispatchFlow, tcp.HandleGuestFrame
//	tcp/input.go       HandleGuestFrame finds the connection; guestSegment, guestAck,
//	                   guestData, which writes the payload straight from guest memory
//	hostsock/io.go     IO.Send: sendmsg on the connection's socket
//
// # Host data, recvmsg to the used ring (four files)
//
//	hostsock/io.go     IO.Peek: recvmsg(MSG_PEEK) straight into guest buffers the
//	                   output pass reserved (tcp/output.go Flush → sendData)
//	tcp/send.go        sendData takes what was read, frame by frame: commitData
//	tcp/frame.go       buildHeaders writes Ethernet, IP and TCP headers in place
//	guestring/commit.go Writer.Commit pushes the used element; Publish, at the end
//	                   of the loop's iteration, makes the batch visible (used.idx)
//
// UDP and ICMP take the same roads through dgram (dgram/udp.go,
// dgram/icmp.go) instead of tcp; ARP, DHCP, DHCPv6 and NDP are answered by
// linksvc into a reply ring (replies.go) that rx.go writes out first.
//
// [Stack] implements virtqueue's data-plane contract (DataPlane, Announcer,
// SessionEnder, MTUSetter) directly. The package must not import vhostuser,
// metrics or cmd, so the control plane and the exporters stay replaceable
// around it. docs/architecture.md in the repository tells the whole story.
package tcpstack

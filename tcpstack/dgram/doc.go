// Package dgram translates the guest's datagrams: UDP flows, each a
// connected host UDP socket per guest 4-tuple; ICMP echo, through
// unprivileged ping sockets; and forwarded host UDP ports (passt's -u),
// whose peers the guest answers through sockets sharing the port.
//
// Guest → host: the TX path hands a parsed datagram (UDP, ICMP) to the
// Table, which asks the address policy (stats.PolicyGate) before it opens a
// socket and sends the payload straight from guest memory: a flow's UDP
// datagrams are queued and go out together when the TX batch ends
// (FlushSends: one sendmmsg, same-size runs as UDP_SEGMENT messages;
// udp_send.go). Host → guest: sockets that epoll reports readable are
// queued (Ready) and read, in Flush, straight into guest buffers reserved
// from a guestring.Sink, behind headers built in place: a UDP flow's
// datagrams with one recvmmsg per batch, what UDP_GRO coalesced cut back
// into datagrams (udp_recv.go).
//
// A Table belongs to one queue pair and outlives its loops (Attach and
// Detach move its sockets between epoll sets); one goroutine uses it at a
// time. A flow whose datagrams the guest sends on another pair's TX queue
// moves to that pair's table (directory.go: HandOff, Import), its socket
// and host port with it. It imports guestring, hostsock, header, stats, addrpolicy and
// virtqueue of vunet's, never the TCP translation or the link services.
package dgram

// Package hostsock is the data path's one layer of host-socket system
// calls: sendmsg, recvmsg (peek, truncate, with the sender's address),
// recvmmsg and sendmmsg of datagram batches (UDP_SEGMENT and UDP_GRO
// included) and the socket options TCP translation reads, all on preallocated iovec and
// msghdr storage so the hot path does not allocate (x/sys/unix's
// convenience wrappers do); opening sockets (connect with an outbound
// source address, listening on forwarded ports, accepting); and the event
// loop's epoll set with the one encoding of its 64-bit tokens, and the
// numbered slots (Slots) that the tables' forwarded ports are named by in
// those tokens.
//
// It knows sockets, not protocols: which address a guest flow may reach
// is package addrpolicy's decision, what the bytes mean is the caller's.
// Of vunet's packages it imports none.
package hostsock

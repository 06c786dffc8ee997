// Package handover moves a guest's flows from one vunet to another on the
// same host, when QEMU live-migrates the guest between two vunets: the
// source hands its host sockets (SCM_RIGHTS) and each flow's state to the
// destination, so the guest's open TCP connections and UDP and ICMP flows
// go on from the destination as if nothing had happened.
//
// The package is the wire between the two processes and knows nothing of
// TCP or datagrams: an Item is one flow's state, opaque bytes that the
// tcp or dgram table that exported it decodes and checks again when it
// imports it, with at most one socket. The channel is a SOCK_SEQPACKET UNIX
// socket (message boundaries keep descriptors with the bytes they belong
// to):
//
//	destination → source   HELLO    (at the destination's start: its version)
//	source → destination   HELLO    (the source's version)
//	source → destination   STATE…, END   when QEMU stopped the source's rings
//	                                  during a migration: every flow, in
//	                                  messages of at most MaxItemsPerMessage
//	                                  items and MaxFDsPerMessage sockets
//	source → destination   ABORT    the source's rings ran again before the
//	                                  destination took over: the state sent is
//	                                  stale (a fresh one follows at the next stop)
//	destination → source   COMMIT   the guest runs on the destination, which
//	                                  took the flows: the source forgets them
//
// Everything read is checked: message types and sizes, item counts and
// lengths against fixed bounds, one socket per item that says it has one
// and no socket more; a malformed message ends the exchange and closes
// every descriptor received with it. The source is another vunet of this
// host, but a process that can reach the socket could be anything.
package handover

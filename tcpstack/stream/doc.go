// Package stream is the wire of QEMU's -netdev stream protocol, the
// transport passt serves when started without --vhost-user: Ethernet
// frames on a UNIX stream socket, each preceded by its length as a 32-bit
// big-endian integer, with no virtio-net header and so no offloads
// either way.
//
// Reader takes frames off the socket: buffered reads of many frames at a
// time, a frame split across reads kept for the next, a length out of
// bounds reported (the stream cannot be resynchronised after it; the
// caller closes the connection). Writer puts frames for the guest into a
// send buffer as a guestring.Sink (producers reserve, build in place and
// commit exactly as into guest RX buffers) and writes them out with one
// sendmsg per batch. A frame is committed only into the send buffer, and
// everything in the send buffer is written in full, in order, whatever
// the socket accepts at a time: a partial write leaves the rest of its
// frame first in line for the next write. When the socket's buffer is
// full the send buffer fills, reservations fail (the producers wait, as
// for a guest that posted no RX buffers) and the writer waits for
// EPOLLOUT, so no frame that a sequence number was advanced for is ever
// dropped (DESIGN's invariant 1).
//
// Neither allocates after Init. The event loop that drives them, and
// dispatches the frames, is tcpstack's (one code path from the frame up
// for both transports).
//
// It imports tcpstack/guestring, tcpstack/hostsock, tcpstack/stats and
// virtqueue of vunet's.
package stream

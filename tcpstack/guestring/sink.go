package guestring

import "vunet/virtqueue"

// Sink is where the data path's producers (TCP connections, UDP and ICMP
// flows) put frames for the guest: straight into buffers the guest posted,
// reserved before anything is read from a host socket. Writer implements it
// over a split ring; anything that can hand out buffers for one frame at a
// time and publish them in order can (a stream transport, a test).
//
// This shape is what makes frame accounting exact (DESIGN invariant 1): a
// producer peeks socket data into the payload buffers of reservations it
// already holds and advances its sequence only by what it Commits. Nothing
// is ever "sent" that could later fail to find a buffer.
type Sink interface {
	// Reserve takes buffers for one frame: hdrLen bytes of headers
	// (Ethernet onward; the sink owns the virtio-net header in front of
	// them) and up to maxPayload bytes of payload. hdr is contiguous and
	// exactly hdrLen long. payload is writable memory, 1..maxPayload bytes
	// in total when maxPayload > 0 (less when the buffers are smaller and
	// cannot be merged), nil when maxPayload == 0. The [][]byte itself may
	// be reused by the next Reserve; the memory it points to stays valid
	// until Commit or Abort. Several reservations may be outstanding. On
	// anything but OK nothing is reserved: NoDesc and Limited mean later,
	// NoFit and Broken never.
	Reserve(hdrLen, maxPayload int) (hdr []byte, payload [][]byte, s Status)
	// Commit publishes the oldest outstanding reservation as a frame of
	// hdrLen+payloadLen bytes. vh carries the checksum/GSO fields for the
	// virtio-net header; the sink sets NumBuffers itself.
	Commit(payloadLen int, vh *virtqueue.NetHdr)
	// Abort gives back every outstanding, uncommitted reservation.
	Abort()
	// Enabled reports whether frames are supplied at all: while the ring
	// is disabled, data for the guest is discarded, not queued (vhost-user
	// spec).
	Enabled() bool
	// MoreLater reports, after a reservation came out shorter than a frame
	// needs, whether waiting can give more (the guest refills, or this
	// iteration's reservations are published); false means that is all a
	// frame can get.
	MoreLater() bool
	// Merging reports whether a reservation is made of as many guest
	// buffers as its payload needs (MRG_RXBUF): reserving much more than a
	// frame then costs buffers, since the ones a short Commit leaves go
	// back to the guest empty while later reservations are outstanding.
	// Without it a reservation is one buffer (or one region) whatever
	// maxPayload asks.
	Merging() bool
}

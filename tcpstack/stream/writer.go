package stream

import (
	"errors"
	"log/slog"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/hostsock"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

const (
	// SendBufSize is the default send buffer: frames committed and not
	// yet written, and the reservations being filled. 4 MiB holds 64
	// frames of 64 KiB, one TCP output pass at the largest MTU.
	SendBufSize = 4 << 20
	// maxQueued bounds the frames committed and not yet written: one
	// sendmsg takes them all (Linux UIO_MAXIOV).
	maxQueued = hostsock.MaxIovecs
	// maxOutstanding bounds reservations handed out and not yet
	// committed or aborted (the TCP table reserves up to 64 per pass).
	maxOutstanding = 64
	// maxHdr bounds the headers of a reservation, as guestring's does.
	maxHdr = 256
)

// reservation is a frame being built: buf[off:end] with the length
// prefix first, then hdrLen bytes of headers and the payload.
type reservation struct {
	off, end, hdrLen int
}

// Writer puts frames for the guest into a send buffer and writes them to
// the stream socket. It implements guestring.Sink, with the loop-facing
// methods of guestring.Writer (WriteFrame, BeginIteration, Starved,
// Limited, Publish).
//
// The send buffer is used as a ring of contiguous regions, one per
// frame, taken in order at Reserve and freed in order as writes complete.
// The frames committed and not yet written form the scatter list of the
// next sendmsg: a reservation committed short leaves a hole that is simply
// not written.
type Writer struct {
	fd  int
	st  *stats.Queue
	log *slog.Logger
	buf []byte
	// tail is where the next region starts, unless it does not fit there
	// (alloc).
	tail int

	// queue[qHead:qHead+qLen] are committed frames, oldest first, length
	// prefix included; starts their offsets in buf. sent bytes of the
	// first one are written already.
	queue         [maxQueued][]byte
	starts        [maxQueued]int
	qHead, qLen   int
	sent          int
	rq            [maxOutstanding]reservation
	rqHead, rqLen int

	iov    [1][]byte // the payload Reserve hands out
	capIov [1][]byte // the frame Commit hands to the capture
	io     hostsock.IO

	blocked bool  // the last write stopped short: wait for EPOLLOUT
	err     error // a write failed: the connection is dead
	starved bool  // a reservation waited for the socket in this iteration
	limited bool  // a reservation waited for this iteration's own reservations

	capture guestring.FrameCapture
	pair    int
}

// Init makes w write to the stream socket fd through a send buffer of
// size bytes (at least a few largest frames), counting into st.
func (w *Writer) Init(fd int, size int, st *stats.Queue, log *slog.Logger) {
	size = max(size, 4*(LenSize+maxHdr+MaxFrame))
	if len(w.buf) != size {
		w.buf = make([]byte, size)
	}
	w.fd, w.st, w.log = fd, st, log
	w.tail, w.qHead, w.qLen, w.sent, w.rqHead, w.rqLen = 0, 0, 0, 0, 0, 0
	clear(w.queue[:])
	w.blocked, w.err, w.starved, w.limited = false, nil, false, false
}

// SetCapture makes every committed frame of pair go to c too (nil: none).
func (w *Writer) SetCapture(c guestring.FrameCapture, pair int) { w.capture, w.pair = c, pair }

// Sink: frames go through the send buffer, in Reserve order.
var _ guestring.Sink = (*Writer)(nil)

// head is the offset of the oldest live region (a queued frame, else a
// reservation), -1 when there is none.
func (w *Writer) head() int {
	switch {
	case w.qLen > 0:
		return w.starts[w.qHead]
	case w.rqLen > 0:
		return w.rq[w.rqHead].off
	}
	return -1
}

// alloc finds need contiguous free bytes. The live regions run from
// head() to tail, around the end of buf when tail < head; a region never
// ends exactly at head, so tail == head only when nothing is live.
func (w *Writer) alloc(need int) (off int, ok bool) {
	h := w.head()
	switch {
	case h < 0:
		w.tail = 0
		return 0, need <= len(w.buf)
	case w.tail >= h:
		if len(w.buf)-w.tail >= need {
			return w.tail, true
		}
		if h > need { // wrap to the front
			return 0, true
		}
	case h-w.tail > need:
		return w.tail, true
	}
	return 0, false
}

// Reserve implements guestring.Sink. The payload is one buffer of up to
// maxPayload bytes, less only when the frame would exceed MaxFrame. When
// the send buffer is full it first writes what is committed; if the
// socket cannot take it, the reservation fails with NoDesc (the writer is
// Starved and the loop waits for EPOLLOUT), and if only this iteration's
// own reservations fill it, with Limited.
func (w *Writer) Reserve(hdrLen, maxPayload int) (hdr []byte, payload [][]byte, s guestring.Status) {
	if w.err != nil {
		return nil, nil, guestring.Broken
	}
	if hdrLen < 0 || hdrLen > maxHdr || maxPayload < 0 {
		return nil, nil, guestring.NoFit
	}
	if w.rqLen == len(w.rq) {
		w.limited = true
		return nil, nil, guestring.Limited
	}
	pay := min(maxPayload, MaxFrame-hdrLen)
	need := LenSize + hdrLen + pay
	off, ok := w.place(need)
	if !ok && w.qLen > 0 && !w.blocked {
		w.Flush()
		if w.err != nil {
			return nil, nil, guestring.Broken
		}
		off, ok = w.place(need)
	}
	if !ok {
		if w.qLen > 0 {
			w.starved = true // written only once the socket drains
			return nil, nil, guestring.NoDesc
		}
		if w.rqLen == 0 {
			return nil, nil, guestring.NoFit // cannot happen: buf holds the largest frame
		}
		w.limited = true
		return nil, nil, guestring.Limited
	}
	w.rq[(w.rqHead+w.rqLen)%len(w.rq)] = reservation{off: off, end: off + need, hdrLen: hdrLen}
	w.rqLen++
	w.tail = off + need
	h := off + LenSize
	hdr = w.buf[h : h+hdrLen : h+hdrLen]
	if pay == 0 {
		return hdr, nil, guestring.OK
	}
	w.iov[0] = w.buf[h+hdrLen : off+need : off+need]
	return hdr, w.iov[:], guestring.OK
}

// place finds room for a region of need bytes and for its frame in the
// queue (compacting the queue's array when its front is free).
func (w *Writer) place(need int) (int, bool) {
	if w.qHead+w.qLen+w.rqLen >= len(w.queue) && w.qHead > 0 {
		copy(w.queue[:], w.queue[w.qHead:w.qHead+w.qLen])
		copy(w.starts[:], w.starts[w.qHead:w.qHead+w.qLen])
		w.qHead = 0
	}
	if w.qHead+w.qLen+w.rqLen >= len(w.queue) {
		return 0, false
	}
	return w.alloc(need)
}

// Commit implements guestring.Sink: the oldest reservation becomes a
// frame of its headers and payloadLen bytes, queued to be written in
// full. vh is unused: the stream carries no virtio-net header, and frames
// to the guest carry complete checksums.
func (w *Writer) Commit(payloadLen int, vh *virtqueue.NetHdr) {
	if w.rqLen == 0 {
		w.log.Error("stream commit without reservation")
		return
	}
	r := w.rq[w.rqHead]
	w.rqHead = (w.rqHead + 1) % len(w.rq)
	w.rqLen--
	if room := r.end - r.off - LenSize - r.hdrLen; payloadLen > room || payloadLen < 0 {
		w.log.Error("stream commit longer than reserved", "len", payloadLen, "reserved", room)
		payloadLen = max(min(payloadLen, room), 0)
	}
	n := r.hdrLen + payloadLen
	end := r.off + LenSize + n
	putLen(w.buf[r.off:], n)
	if w.rqLen == 0 {
		w.tail = end // the unused rest of the region is free again
	}
	i := w.qHead + w.qLen
	w.queue[i] = w.buf[r.off:end:end]
	w.starts[i] = r.off
	w.qLen++
	w.st.RX.Frames.Add(1)
	w.st.RX.Bytes.Add(uint64(n))
	if w.capture != nil {
		w.capIov[0] = w.buf[r.off+LenSize : end]
		w.capture.Frame(w.pair, w.capIov[:], 0, n)
		w.capIov[0] = nil
	}
}

// Abort implements guestring.Sink: the outstanding reservations are
// given back (they are the newest regions).
func (w *Writer) Abort() {
	if w.rqLen > 0 {
		w.tail = w.rq[w.rqHead].off
		w.rqLen = 0
	}
}

// Enabled implements guestring.Sink: a stream is always supplied.
func (w *Writer) Enabled() bool { return true }

// Merging implements guestring.Sink: a reservation is one region of the
// send buffer, of which a short Commit writes only what it holds.
func (w *Writer) Merging() bool { return false }

// MoreLater implements guestring.Sink: a reservation is short only when
// the frame would exceed MaxFrame, which waiting does not change.
func (w *Writer) MoreLater() bool { return false }

// WriteFrame queues a copy of frame (Ethernet onward). flags is for the
// virtio-net header, which the stream does not carry. No reservation may
// be outstanding.
func (w *Writer) WriteFrame(frame []byte, flags uint8) guestring.Status {
	if w.rqLen != 0 {
		w.log.Error("stream writeFrame with reservations outstanding")
		return guestring.Limited
	}
	if len(frame) > MaxFrame {
		return guestring.NoFit
	}
	_, pay, s := w.Reserve(0, len(frame))
	if s != guestring.OK {
		return s
	}
	copy(pay[0], frame)
	w.Commit(len(frame), nil)
	return guestring.OK
}

// Flush writes the queued frames with one sendmsg, unless a write
// already stopped short and EPOLLOUT has not come since (Writable). A
// write that stops short leaves the rest, the rest of a frame first, for
// the next one.
func (w *Writer) Flush() {
	if w.qLen == 0 || w.blocked || w.err != nil {
		return
	}
	n, err := w.io.Send(w.fd, w.queue[w.qHead:w.qHead+w.qLen], w.sent, int(^uint(0)>>1))
	switch {
	case errors.Is(err, unix.EAGAIN):
		w.blocked = true
		w.st.Stream.WriteWaits.Add(1)
		return
	case err != nil:
		w.fail(err)
		return
	}
	w.st.Stream.Writes.Add(1)
	w.st.Stream.WriteBytes.Add(uint64(n))
	w.st.RX.Batches.Add(1)
	for n > 0 {
		rest := len(w.queue[w.qHead]) - w.sent
		if n < rest {
			w.sent += n
			break
		}
		n -= rest
		w.queue[w.qHead] = nil
		w.sent = 0
		w.qHead++
		w.qLen--
	}
	if w.qLen == 0 {
		w.qHead = 0
		return
	}
	// The socket took less than everything: its buffer is full.
	w.blocked = true
	w.st.Stream.WriteWaits.Add(1)
}

// fail records a write error: the connection is dead, nothing more is
// written and the queue is dropped (the session ends with it).
func (w *Writer) fail(err error) {
	w.err = err
	w.st.Stream.WriteErrors.Add(1)
	for i := w.qHead; i < w.qHead+w.qLen; i++ {
		w.queue[i] = nil
	}
	w.qHead, w.qLen, w.sent = 0, 0, 0
}

// Writable is EPOLLOUT: the socket takes data again; the queue is
// written.
func (w *Writer) Writable() {
	w.blocked = false
	w.Flush()
}

// Blocked reports whether frames wait for the socket (the loop watches
// EPOLLOUT while they do).
func (w *Writer) Blocked() bool { return w.blocked && w.err == nil }

// Err returns the write error that ended the connection, if any.
func (w *Writer) Err() error { return w.err }

// Queued returns the bytes committed and not yet written.
func (w *Writer) Queued() int {
	n := -w.sent
	for _, b := range w.queue[w.qHead : w.qHead+w.qLen] {
		n += len(b)
	}
	return n
}

// Publish aborts what is outstanding and writes the queue: the loop's
// end of an iteration.
func (w *Writer) Publish() {
	w.Abort()
	w.Flush()
}

// BeginIteration clears what the previous loop iteration learned
// (Starved, Limited).
func (w *Writer) BeginIteration() { w.starved, w.limited = false, false }

// Starved reports whether a reservation in this iteration waited for the
// socket to drain.
func (w *Writer) Starved() bool { return w.starved }

// Limited reports whether a reservation in this iteration waited for
// this iteration's own reservations: the loop comes back at once.
func (w *Writer) Limited() bool { return w.limited }

package guestring

import (
	"vunet/tcpstack/header"
	"vunet/virtqueue"
)

// Commit implements Sink: it publishes the oldest reservation as
// a frame of its header length plus payloadLen bytes.
func (r *Writer) Commit(payloadLen int, vh *virtqueue.NetHdr) {
	if r.rqLen == 0 {
		r.log.Error("RX commit without reservation")
		return
	}
	rv := &r.rq[r.rqHead]
	r.rqHead = (r.rqHead + 1) % len(r.rq)
	r.rqLen--
	r.returnSpares()
	if r.used != rv.first {
		// Committing out of order is a caller bug; the chains before are
		// reservations we cannot account for any more.
		r.log.Error("RX commit out of order", "used", r.used, "first", rv.first)
	}
	total := r.vhLen + rv.hdrLen + payloadLen
	// The chains the bytes occupy: fewer than reserved when the payload
	// came out short.
	n, rest := 0, total
	for rv.first+n < rv.end && rest > 0 {
		rest -= r.res[rv.first+n].WritableLen()
		n++
	}
	if rest > 0 {
		r.log.Error("RX commit longer than reserved", "len", total)
		payloadLen -= rest
		total -= rest
	}
	if rv.bounced {
		copyToChains(r.res[rv.first:rv.first+n], r.vhLen, rv.hdr)
	}
	var h virtqueue.NetHdr
	if vh != nil {
		h = *vh
	}
	h.NumBuffers = uint16(n)
	h.Encode(r.vh[:r.vhLen])
	copyToChains(r.res[rv.first:rv.first+1], 0, r.vh[:r.vhLen])
	rest = total
	for i := rv.first; i < rv.first+n; i++ {
		c := &r.res[i]
		w := min(c.WritableLen(), rest)
		rest -= w
		r.q.Push(c.Head, uint32(w))
	}
	r.staged += n
	if r.capture != nil {
		r.captureCommitted(rv.first, n, total)
	}
	r.used = rv.first + n
	if rv.end > r.used {
		if r.rqLen == 0 {
			// Nothing reserved behind: the spare chains go back to the pool.
			r.assigned = r.used
		} else {
			// Reservations follow: if they are all aborted the spares rejoin
			// the pool; if one is committed they must go back empty first.
			r.spareFrom, r.spareTo = r.used, rv.end
		}
	}
	r.st.RX.Frames.Add(1)
	r.st.RX.Bytes.Add(uint64(rv.hdrLen + payloadLen))
}

// returnSpares hands the spare chains of the last short commit back to the
// guest empty: a frame is about to be published behind them, so they can be
// neither rewound nor reused. The driver drops a 0-length buffer.
func (r *Writer) returnSpares() {
	for i := r.spareFrom; i < r.spareTo; i++ {
		r.q.Push(r.res[i].Head, 0)
		r.staged++
		r.st.RXChainsWasted.Add(1)
	}
	if r.spareTo > r.spareFrom {
		r.used = r.spareTo
	}
	r.spareFrom, r.spareTo = 0, 0
}

// Abort implements Sink: every outstanding reservation, and the
// spares of a short commit before them, go back to the pool of popped
// chains (rewound at publish).
func (r *Writer) Abort() {
	r.rqLen = 0
	r.spareFrom, r.spareTo = 0, 0
	r.assigned = r.used
}

// WriteFrame copies frame (Ethernet onward) into the guest's RX buffers
// behind a virtio-net header with flags (NetHdrFDataValid etc.). No
// reservation may be outstanding.
func (r *Writer) WriteFrame(frame []byte, flags uint8) Status {
	if r.rqLen != 0 {
		r.log.Error("RX writeFrame with reservations outstanding")
		return Limited
	}
	for try := 0; ; try++ {
		_, niov, plen, s := r.reserve(0, len(frame))
		if s == Limited && try == 0 {
			r.Publish()
			continue
		}
		if s != OK {
			return s
		}
		if plen < len(frame) {
			r.Abort()
			if !r.mrg {
				return NoFit
			}
			if r.starved {
				return NoDesc
			}
			if try == 0 {
				r.Publish() // reservation array full: start over empty
				continue
			}
			return NoFit
		}
		src := frame
		for _, b := range r.iov[:niov] {
			src = src[copy(b, src):]
		}
		h := virtqueue.NetHdr{Flags: flags}
		r.Commit(len(frame), &h)
		return OK
	}
}

// copyToChains copies src into the chains' concatenated writable buffers at
// byte offset off.
func copyToChains(chains []virtqueue.Chain, off int, src []byte) {
	for i := range chains {
		if len(src) == 0 {
			return
		}
		if n := chains[i].WritableLen(); off >= n {
			off -= n
			continue
		}
		src = src[header.WriteIovecs(chains[i].Writable, off, src):]
		off = 0
	}
}

// Publish makes the pushed chains visible with one used-index store (Flush
// decides about the interrupt) and rewinds the popped, unused chains. Any
// outstanding reservation is aborted. The loop calls it once per iteration
// and when it stops.
func (r *Writer) Publish() {
	r.Abort()
	for r.used < r.pinned && r.used < r.nres {
		r.q.Push(r.res[r.used].Head, 0)
		r.used++
		r.staged++
		r.st.RXChainsWasted.Add(1)
	}
	if n := r.nres - r.used; n > 0 {
		r.q.Unpop(n)
	}
	r.nres, r.used, r.assigned, r.pinned = 0, 0, 0, 0
	// The queue knows best what is staged: Pop stages bad chains itself.
	if r.staged > 0 || r.q.Staged() > 0 {
		r.st.RX.Batches.Add(1) // before Flush: counters never lag the ring
		r.q.Flush()
		r.staged = 0
	}
}

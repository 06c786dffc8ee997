package tcpstack

import (
	"log/slog"

	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

const (
	// rxReserveMax bounds the RX chains popped at once. With MRG_RXBUF a
	// 64 KiB frame needs 16 chains of 4 KiB guest buffers (45 of 1.5 KiB);
	// 256 holds a few such frames in flight. A Chain is about 3 KiB, so
	// this is ~800 KiB per pair, allocated once.
	rxReserveMax = 256
	// rxMaxOutstanding bounds reservations handed out and not yet
	// committed or aborted (the TCP table reserves up to 64 per flow pass).
	rxMaxOutstanding = 64
	// rxIovMax bounds the payload iovecs one reservation returns; a longer
	// scatter list just makes the payload shorter.
	rxIovMax = 1024
	// rxMaxFrameHdr bounds the frame headers (Ethernet onward) a reservation
	// carries in front of the payload: Ethernet + IPv6 + TCP with options.
	rxMaxFrameHdr = 256
)

// rxStatus is the outcome of trying to place a frame in guest RX buffers.
type rxStatus uint8

const (
	rxOK      rxStatus = iota
	rxNoDesc           // the guest has not posted enough buffers: wait for a refill
	rxNoFit            // the frame can never fit (too big for the buffers): drop it
	rxBroken           // the RX ring is broken: drop everything
	rxLimited          // our own reservation capacity ran out: retry after publishing
)

// rxReservation is one frame's worth of reserved chains, res[first:end].
type rxReservation struct {
	first, end int
	hdrLen     int
	hdr        []byte // where the frame headers are built: guest memory or bounce
	bounced    bool   // hdr is bounce: copy into the chain at Commit
	bounce     [rxMaxFrameHdr]byte
}

// rxWriter places frames for the guest into RX chains. Chains are popped
// ahead of need, handed out as reservations, filled strictly in pop order,
// pushed when committed, published with one Flush per loop iteration (EVENT_IDX
// then decides the interrupt), and whatever was popped and not used is
// rewound with Unpop, so no guest buffer is ever lost.
//
// It implements tcpFrameWriter. All reservations must be committed or aborted
// before control returns to the event loop.
type rxWriter struct {
	q      *virtqueue.SplitQueue
	st     *stats.Queue
	log    *slog.Logger
	vhLen  int  // virtio-net header length (10 or 12)
	mrg    bool // VIRTIO_NET_F_MRG_RXBUF: a frame may span chains
	enable bool // RX ring enabled: supply frames at all

	res  [rxReserveMax]virtqueue.Chain
	nres int // chains popped into res
	used int // res[:used] are pushed (or were given back empty)
	// assigned: res[used:assigned] belong to outstanding reservations,
	// res[assigned:nres] are popped and free for the next reservation.
	assigned int
	// pinned: res[:pinned] can no longer be rewound, because Pop returned a
	// bad chain to the guest after them (virtqueue clamps Unpop there).
	// Unused ones among them are returned empty at publish instead.
	pinned int
	staged int // used elements pushed since the last Flush
	// spareFrom..spareTo: chains of a frame committed short while later
	// reservations were outstanding; res[:spareFrom] are pushed.
	spareFrom, spareTo int

	rq            [rxMaxOutstanding]rxReservation
	rqHead, rqLen int

	iov [rxIovMax][]byte
	vh  [virtqueue.NetHdrLen]byte

	broken  bool
	starved bool // a reservation found the ring empty: want a refill kick
	limited bool // a reservation hit our own capacity: come back soon

	// capture, when set, sees every committed frame (Config.Capture);
	// capIov is its preallocated scatter list.
	capture FrameCapture
	pair    int
	capIov  [][]byte
}

func (r *rxWriter) init(q *virtqueue.SplitQueue, st *stats.Queue, log *slog.Logger, features uint64, enabled bool) {
	r.q = q
	r.st = st
	r.log = log
	r.vhLen = virtqueue.NetHdrLenFor(features)
	r.mrg = virtqueue.HasFeature(features, virtqueue.FeatureNetMrgRxbuf)
	r.enable = enabled
}

// setCapture makes every committed frame of pair go to c too (nil: none).
func (r *rxWriter) setCapture(c FrameCapture, pair int) {
	r.capture, r.pair = c, pair
	if c != nil && r.capIov == nil {
		r.capIov = make([][]byte, 0, rxCaptureIovMax)
	}
}

// popOne pops one more chain into res[nres].
func (r *rxWriter) popOne() rxStatus {
	if r.broken {
		return rxBroken
	}
	if r.nres == len(r.res) {
		return rxLimited
	}
	before := r.q.Staged()
	ok, err := r.q.Pop(&r.res[r.nres])
	if r.q.Staged() != before {
		// Pop skipped a bad chain and staged it as used: the chains we hold
		// are not rewindable past it any more.
		r.pinned = r.nres
		r.staged++
	}
	if err != nil {
		r.broken = true
		r.log.Error("RX ring broken: no more frames to the guest until the ring is reset", "err", err)
		return rxBroken
	}
	if !ok {
		return rxNoDesc
	}
	r.nres++
	return rxOK
}

// chainAt makes res[i] available (popping as needed, i == nres at most).
func (r *rxWriter) chainAt(i int) rxStatus {
	if i < r.nres {
		return rxOK
	}
	return r.popOne()
}

// reserve takes chains for a frame of hdrLen header bytes and up to
// maxPayload payload bytes. On rxOK the reservation is queued and the payload
// iovecs are in r.iov[:niov], totalling plen bytes.
func (r *rxWriter) reserve(hdrLen, maxPayload int) (rv *rxReservation, niov, plen int, s rxStatus) {
	if !r.enable {
		return nil, 0, 0, rxNoFit
	}
	if hdrLen > rxMaxFrameHdr || hdrLen < 0 || maxPayload < 0 {
		return nil, 0, 0, rxNoFit
	}
	if r.rqLen == len(r.rq) {
		return nil, 0, 0, rxLimited
	}
	if r.rqLen == 0 && r.nres > len(r.res)/2 {
		// Nothing outstanding: publish what is done and rewind the spare
		// chains, so the reservation array starts empty again.
		r.publish()
	}
	minFirst := r.vhLen + hdrLen + min(maxPayload, 1)
	// The first chain carries the virtio-net header and the frame headers.
	for {
		if s := r.chainAt(r.assigned); s != rxOK {
			return nil, 0, 0, r.noChain(s)
		}
		wl := r.res[r.assigned].WritableLen()
		if wl >= minFirst || (r.mrg && wl >= r.vhLen+max(hdrLen, ethHdrLen)) {
			break // with MRG_RXBUF the payload may start in the next chain
		}
		if wl < r.vhLen+ethHdrLen && r.assigned == r.used {
			// Useless for any frame: hand it back empty. Only at the front,
			// so the chains still held stay a rewindable tail.
			r.q.Push(r.res[r.assigned].Head, 0)
			r.used++
			r.assigned++
			r.staged++
			r.st.RX.Drops[stats.DropBadRXChain].Add(1)
			continue
		}
		if r.rqLen == 0 {
			return nil, 0, 0, rxNoFit // this frame does not fit the guest's buffer
		}
		r.limited = true // retry once the reservations ahead are done
		return nil, 0, 0, rxLimited
	}
	first := r.assigned
	rv = &r.rq[(r.rqHead+r.rqLen)%len(r.rq)]
	rv.first, rv.hdrLen, rv.bounced = first, hdrLen, false

	// Walk the first chain's writable buffers: skip the virtio-net header,
	// place the frame headers, then collect payload iovecs.
	skip := r.vhLen
	hdrDone := 0
	niov, plen = 0, 0
	end := first
	for i := first; ; i++ {
		if i > first {
			if !r.mrg || plen >= maxPayload || niov == len(r.iov) {
				break
			}
			if s := r.chainAt(i); s != rxOK {
				if s == rxNoDesc {
					r.starved = true // partial frame now, more when the guest refills
				} else if s == rxLimited {
					r.limited = true
				}
				break
			}
		}
		end = i + 1
		for _, b := range r.res[i].Writable {
			if skip >= len(b) {
				skip -= len(b)
				continue
			}
			b = b[skip:]
			skip = 0
			if hdrDone < hdrLen {
				if hdrDone == 0 && len(b) >= hdrLen {
					rv.hdr = b[:hdrLen:hdrLen]
				} else {
					rv.bounced = true
					rv.hdr = rv.bounce[:hdrLen]
				}
				n := min(len(b), hdrLen-hdrDone)
				hdrDone += n
				b = b[n:]
			}
			if len(b) == 0 || plen >= maxPayload || niov == len(r.iov) {
				continue
			}
			if len(b) > maxPayload-plen {
				b = b[:maxPayload-plen]
			}
			r.iov[niov] = b
			niov++
			plen += len(b)
		}
	}
	if hdrLen == 0 {
		rv.hdr = nil
	}
	if maxPayload > 0 && plen == 0 {
		// Headers fit but the ring has nothing more for the payload now.
		return nil, 0, 0, r.noChain(rxNoDesc)
	}
	rv.end = end
	r.assigned = end
	r.rqLen++
	return rv, niov, plen, rxOK
}

func (r *rxWriter) noChain(s rxStatus) rxStatus {
	switch s {
	case rxNoDesc:
		r.starved = true
	case rxLimited:
		if r.rqLen == 0 && r.used == 0 {
			return rxNoFit // larger than everything we can hold
		}
		r.limited = true
	}
	return s
}

// Reserve implements tcpFrameWriter.
func (r *rxWriter) Reserve(hdrLen, maxPayload int) (hdr []byte, payload [][]byte, ok bool) {
	rv, niov, _, s := r.reserve(hdrLen, maxPayload)
	if s != rxOK {
		return nil, nil, false
	}
	return rv.hdr, r.iov[:niov:niov], true
}

// Commit implements tcpFrameWriter: it publishes the oldest reservation as
// a frame of its header length plus payloadLen bytes.
func (r *rxWriter) Commit(payloadLen int, vh *virtqueue.NetHdr) {
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
func (r *rxWriter) returnSpares() {
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

// Abort implements tcpFrameWriter: every outstanding reservation, and the
// spares of a short commit before them, go back to the pool of popped
// chains (rewound at publish).
func (r *rxWriter) Abort() {
	r.rqLen = 0
	r.spareFrom, r.spareTo = 0, 0
	r.assigned = r.used
}

// writeFrame copies frame (Ethernet onward) into the guest's RX buffers
// behind a virtio-net header with flags (NetHdrFDataValid etc.).
func (r *rxWriter) writeFrame(frame []byte, flags uint8) rxStatus {
	if r.rqLen != 0 {
		r.log.Error("RX writeFrame with reservations outstanding")
		return rxLimited
	}
	for try := 0; ; try++ {
		_, niov, plen, s := r.reserve(0, len(frame))
		if s == rxLimited && try == 0 {
			r.publish()
			continue
		}
		if s != rxOK {
			return s
		}
		if plen < len(frame) {
			r.Abort()
			if !r.mrg {
				return rxNoFit
			}
			if r.starved {
				return rxNoDesc
			}
			if try == 0 {
				r.publish() // reservation array full: start over empty
				continue
			}
			return rxNoFit
		}
		src := frame
		for _, b := range r.iov[:niov] {
			src = src[copy(b, src):]
		}
		h := virtqueue.NetHdr{Flags: flags}
		r.Commit(len(frame), &h)
		return rxOK
	}
}

// copyToChains copies src into the chains' concatenated writable buffers at
// byte offset off.
func copyToChains(chains []virtqueue.Chain, off int, src []byte) {
	for i := range chains {
		for _, b := range chains[i].Writable {
			if off >= len(b) {
				off -= len(b)
				continue
			}
			n := copy(b[off:], src)
			src = src[n:]
			off = 0
			if len(src) == 0 {
				return
			}
		}
	}
}

// publish makes the pushed chains visible with one used-index store (Flush
// decides about the interrupt) and rewinds the popped, unused chains. Any
// outstanding reservation is aborted.
func (r *rxWriter) publish() {
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

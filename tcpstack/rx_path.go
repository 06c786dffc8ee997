package tcpstack

import (
	"log/slog"

	"vunet/virtqueue"
)

// rxReserveMax bounds the RX chains reserved at once. With MRG_RXBUF a
// 64 KiB frame in 1.5 KiB guest buffers needs about 45 chains; 128 covers
// that with room for several frames per publication. A Chain is about
// 3 KiB, so this is ~400 KiB per pair, allocated once.
const rxReserveMax = 128

// rxStatus is the outcome of trying to place a frame in guest RX buffers.
type rxStatus uint8

const (
	rxOK     rxStatus = iota
	rxNoDesc          // the guest has not posted enough buffers: wait for a refill
	rxNoFit           // the frame can never fit (too big): drop it
	rxBroken          // the RX ring is broken: drop everything
	rxRetry           // internal to span: reservation array full, compact and retry
)

// rxWriter places frames for the guest into reserved RX chains. Chains are
// popped ahead of need ("reserved"), filled strictly in pop order, pushed as
// they are used, published with one Flush per loop iteration, and the unused
// tail is rewound with Unpop so no guest buffer is lost.
type rxWriter struct {
	q      *virtqueue.SplitQueue
	st     *QueueStats
	log    *slog.Logger
	hdrLen int  // virtio-net header length (10 or 12)
	mrg    bool // VIRTIO_NET_F_MRG_RXBUF: a frame may span chains

	res    [rxReserveMax]virtqueue.Chain
	nres   int // chains popped into res
	used   int // res[:used] are pushed; res[used:nres] are reserved
	staged int // chains pushed since the last Flush
	// pinned: res[:pinned] can no longer be rewound, because Pop returned a
	// bad chain to the guest after them (virtqueue clamps Unpop there).
	// Unused ones among them are returned empty at publish instead.
	pinned int
	broken bool
	hdr    virtqueue.NetHdr
	hdrBuf [virtqueue.NetHdrLen]byte
}

func (r *rxWriter) init(q *virtqueue.SplitQueue, st *QueueStats, log *slog.Logger, features uint64) {
	r.q = q
	r.st = st
	r.log = log
	r.hdrLen = virtqueue.NetHdrLenFor(features)
	r.mrg = virtqueue.HasFeature(features, virtqueue.FeatureNetMrgRxbuf)
}

// popOne reserves one more chain at res[nres]. It returns false when the
// ring has no available chain, the reservation array is full, or the ring
// is broken.
func (r *rxWriter) popOne() bool {
	if r.broken || r.nres == len(r.res) {
		return false
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
		if !r.broken {
			r.broken = true
			r.log.Error("RX ring broken: no more frames to the guest until the ring is reset",
				"err", err)
		}
		return false
	}
	if !ok {
		return false
	}
	r.nres++
	return true
}

// front returns the first reserved, unused chain usable as the start of a
// frame, reserving one if needed. Chains whose writable part cannot even hold
// the virtio-net header are returned to the guest empty: at the front of the
// reservation this keeps the unpushed chains a contiguous tail for Unpop.
func (r *rxWriter) front() (*virtqueue.Chain, rxStatus) {
	for {
		if r.used == r.nres {
			if r.nres == len(r.res) {
				r.compact()
			}
			if !r.popOne() {
				if r.broken {
					return nil, rxBroken
				}
				return nil, rxNoDesc
			}
		}
		c := &r.res[r.used]
		if c.WritableLen() >= r.hdrLen {
			return c, rxOK
		}
		r.q.Push(c.Head, 0)
		r.used++
		r.staged++
		r.st.RX.Drops[DropBadRXChain].Add(1)
	}
}

// span reserves enough chains, starting at the front, for need bytes
// (virtio-net header included) and returns how many it takes.
func (r *rxWriter) span(need int) (int, rxStatus) {
	for {
		k, s := r.trySpan(need)
		if s != rxRetry {
			return k, s
		}
		// The reservation array filled up mid-frame: publish what is done,
		// rewind the rest and start over with the whole array.
		r.compact()
	}
}

func (r *rxWriter) trySpan(need int) (int, rxStatus) {
	c, s := r.front()
	if s != rxOK {
		return 0, s
	}
	have := c.WritableLen()
	if have >= need {
		return 1, rxOK
	}
	if !r.mrg {
		return 0, rxNoFit
	}
	k := 1
	for have < need {
		if r.used+k == r.nres {
			if r.nres == len(r.res) {
				if r.used == 0 {
					return 0, rxNoFit // larger than everything we can reserve
				}
				return 0, rxRetry
			}
			if !r.popOne() {
				if r.broken {
					return 0, rxBroken
				}
				return 0, rxNoDesc
			}
		}
		have += r.res[r.used+k].WritableLen()
		k++
	}
	return k, rxOK
}

// compact publishes what is used and rewinds the reserved tail, so the
// reservation array starts empty again. Only called when it is full.
func (r *rxWriter) compact() {
	r.publish()
}

// writeFrame copies frame (Ethernet onward) into the guest's RX buffers
// behind a virtio-net header with flags (NetHdrFDataValid etc.).
func (r *rxWriter) writeFrame(frame []byte, flags uint8) rxStatus {
	if !r.mrg && len(frame)+r.hdrLen > virtqueue.MaxChainBytes {
		return rxNoFit
	}
	k, s := r.span(r.hdrLen + len(frame))
	if s != rxOK {
		return s
	}
	// Copy the frame first, the header last: the header carries num_buffers,
	// which only the final length decides.
	r.copyIn(r.hdrLen, frame, k)
	r.commit(k, len(frame), flags)
	return rxOK
}

// copyIn copies src into the k chains starting at the front, at byte offset
// off of their concatenated writable buffers.
func (r *rxWriter) copyIn(off int, src []byte, k int) {
	for i := 0; i < k && len(src) > 0; i++ {
		for _, b := range r.res[r.used+i].Writable {
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

// commit writes the virtio-net header for a frame of frameLen bytes spread
// over the front chains (at most k of them), pushes those chains with their
// written lengths and advances the front.
func (r *rxWriter) commit(k, frameLen int, flags uint8) {
	total := r.hdrLen + frameLen
	// Count the chains the bytes actually occupy: a socket read may have
	// filled fewer than were reserved for it.
	n, rest := 0, total
	for n < k && rest > 0 {
		rest -= r.res[r.used+n].WritableLen()
		n++
	}
	if n == 0 {
		n = 1
	}
	r.hdr = virtqueue.NetHdr{Flags: flags, NumBuffers: uint16(n)}
	h := r.hdrBuf[:r.hdrLen]
	r.hdr.Encode(h)
	r.copyIn(0, h, 1)
	rest = total
	for i := 0; i < n; i++ {
		c := &r.res[r.used+i]
		w := min(c.WritableLen(), rest)
		rest -= w
		r.q.Push(c.Head, uint32(w))
	}
	r.used += n
	r.staged += n
	r.st.RX.Frames.Add(1)
	r.st.RX.Bytes.Add(uint64(frameLen))
}

// reserved reports how many chains are reserved and not yet used.
func (r *rxWriter) reserved() int { return r.nres - r.used }

// publish makes the pushed chains visible with one used-index store (Flush
// decides about the interrupt) and rewinds the unused reservations.
func (r *rxWriter) publish() {
	for r.used < r.pinned && r.used < r.nres {
		r.q.Push(r.res[r.used].Head, 0)
		r.used++
		r.staged++
	}
	if n := r.nres - r.used; n > 0 {
		r.q.Unpop(n)
	}
	r.nres, r.used, r.pinned = 0, 0, 0
	if r.staged > 0 {
		r.st.RX.Batches.Add(1) // before Flush: counters never lag the ring
		r.q.Flush()
		r.staged = 0
	}
}

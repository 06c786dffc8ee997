package guestring

import (
	"log/slog"

	"vunet/tcpstack/header"
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

// Status is the outcome of trying to place a frame in the guest's buffers.
type Status uint8

// Outcomes of Reserve and WriteFrame.
const (
	// OK: the frame has its buffers.
	OK Status = iota
	// NoDesc: the guest has not posted enough buffers; wait for a refill.
	NoDesc
	// NoFit: the frame can never fit (larger than the guest's buffers, or
	// the ring is disabled); drop it.
	NoFit
	// Broken: the RX ring is broken; drop everything.
	Broken
	// Limited: our own reservation capacity ran out; retry after this
	// iteration publishes.
	Limited
)

// rxReservation is one frame's worth of reserved chains, res[first:end].
type rxReservation struct {
	first, end int
	hdrLen     int
	hdr        []byte // where the frame headers are built: guest memory or bounce
	bounced    bool   // hdr is bounce: copy into the chain at Commit
	bounce     [rxMaxFrameHdr]byte
}

// Writer places frames for the guest into RX chains. Chains are popped
// ahead of need, handed out as reservations, filled strictly in pop order,
// pushed when committed, published with one Flush per loop iteration (EVENT_IDX
// then decides the interrupt), and whatever was popped and not used is
// rewound with Unpop, so no guest buffer is ever lost.
//
// It implements Sink. All reservations must be committed or aborted before
// control returns to the event loop.
type Writer struct {
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
	// bad chain to the guest after them (an Unpop across it would leave
	// LastAvail behind an entry the guest already has back).
	// Unused ones among them are returned empty at publish instead.
	pinned int
	staged int // used elements this writer pushed since the last Flush
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
	// wholeRing: the last reservation that ran out of chains held as many
	// as the ring has entries, so no refill can ever make it longer.
	wholeRing bool

	// capture, when set, sees every committed frame (Config.Capture);
	// capIov is its preallocated scatter list.
	capture FrameCapture
	pair    int
	capIov  [][]byte
}

// Init makes r write to ring q (a pair's RX ring, enabled or not) with the
// virtio-net header and buffer merging the negotiated features call for,
// counting into st.
func (r *Writer) Init(q *virtqueue.SplitQueue, st *stats.Queue, log *slog.Logger, features uint64, enabled bool) {
	r.q = q
	r.st = st
	r.log = log
	r.vhLen = virtqueue.NetHdrLenFor(features)
	r.mrg = virtqueue.HasFeature(features, virtqueue.FeatureNetMrgRxbuf)
	r.enable = enabled
}

// SetCapture makes every committed frame of pair go to c too (nil: none).
func (r *Writer) SetCapture(c FrameCapture, pair int) {
	r.capture, r.pair = c, pair
	if c != nil && r.capIov == nil {
		r.capIov = make([][]byte, 0, rxCaptureIovMax)
	}
}

// popOne pops one more chain into res[nres].
func (r *Writer) popOne() Status {
	if r.broken {
		return Broken
	}
	if r.nres == len(r.res) {
		return Limited
	}
	ok, skipped, err := r.q.PopSkipping(&r.res[r.nres])
	if skipped > 0 {
		// Pop went past a used entry (a bad chain it staged as used): the
		// chains we hold are not rewindable past it any more. What it
		// staged, Publish finds in the queue's own count (Staged).
		r.pinned = r.nres
	}
	if err != nil {
		r.broken = true
		r.log.Error("RX ring broken: no more frames to the guest until the ring is reset", "err", err)
		return Broken
	}
	if !ok {
		return NoDesc
	}
	r.nres++
	return OK
}

// chainAt makes res[i] available (popping as needed, i == nres at most).
func (r *Writer) chainAt(i int) Status {
	if i < r.nres {
		return OK
	}
	return r.popOne()
}

// reserve takes chains for a frame of hdrLen header bytes and up to
// maxPayload payload bytes. On OK the reservation is queued and the payload
// iovecs are in r.iov[:niov], totalling plen bytes.
func (r *Writer) reserve(hdrLen, maxPayload int) (rv *rxReservation, niov, plen int, s Status) {
	if !r.enable {
		return nil, 0, 0, NoFit
	}
	if hdrLen > rxMaxFrameHdr || hdrLen < 0 || maxPayload < 0 {
		return nil, 0, 0, NoFit
	}
	if r.rqLen == len(r.rq) {
		return nil, 0, 0, Limited
	}
	if r.rqLen == 0 && r.nres > len(r.res)/2 {
		// Nothing outstanding: publish what is done and rewind the spare
		// chains, so the reservation array starts empty again.
		r.Publish()
	}
	r.wholeRing = false
	minFirst := r.vhLen + hdrLen + min(maxPayload, 1)
	// The first chain carries the virtio-net header and the frame headers.
	for {
		if s := r.chainAt(r.assigned); s != OK {
			return nil, 0, 0, r.noChain(s)
		}
		wl := r.res[r.assigned].WritableLen()
		if wl >= minFirst || (r.mrg && wl >= r.vhLen+max(hdrLen, header.EthernetMinimumSize)) {
			break // with MRG_RXBUF the payload may start in the next chain
		}
		if wl < r.vhLen+header.EthernetMinimumSize && r.assigned == r.used {
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
			return nil, 0, 0, NoFit // this frame does not fit the guest's buffer
		}
		r.limited = true // retry once the reservations ahead are done
		return nil, 0, 0, Limited
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
			if s := r.chainAt(i); s != OK {
				if s == NoDesc {
					r.starved = true // partial frame now, more when the guest refills
					// Unless the frame already holds every entry of
					// the ring (a chain takes one at least).
					r.wholeRing = i-first >= int(r.q.Size())
				} else if s == Limited {
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
		return nil, 0, 0, r.noChain(NoDesc)
	}
	rv.end = end
	r.assigned = end
	r.rqLen++
	return rv, niov, plen, OK
}

func (r *Writer) noChain(s Status) Status {
	switch s {
	case NoDesc:
		r.starved = true
	case Limited:
		if r.rqLen == 0 && r.used == 0 {
			return NoFit // larger than everything we can hold
		}
		r.limited = true
	}
	return s
}

// Reserve implements Sink.
func (r *Writer) Reserve(hdrLen, maxPayload int) (hdr []byte, payload [][]byte, s Status) {
	rv, niov, _, s := r.reserve(hdrLen, maxPayload)
	if s != OK {
		return nil, nil, s
	}
	return rv.hdr, r.iov[:niov:niov], OK
}

// Enabled implements Sink.
func (r *Writer) Enabled() bool { return r.enable }

// MoreLater implements Sink: a short reservation can grow after a wait when
// frames may span buffers and the guest's ring ran dry (unless it held the
// whole ring), or when our own capacity was the limit.
func (r *Writer) MoreLater() bool { return r.mrg && r.starved && !r.wholeRing || r.limited }

// Merging implements Sink.
func (r *Writer) Merging() bool { return r.mrg }

// BeginIteration clears what the previous loop iteration learned about the
// ring (Starved, Limited).
func (r *Writer) BeginIteration() { r.starved, r.limited = false, false }

// Starved reports whether a reservation in this iteration found the
// guest's ring without buffers: the loop wants the guest's refill kick.
func (r *Writer) Starved() bool { return r.starved }

// Limited reports whether a reservation in this iteration hit our own
// capacity: the loop comes back at once, after publishing.
func (r *Writer) Limited() bool { return r.limited }

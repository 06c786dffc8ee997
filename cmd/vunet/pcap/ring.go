package pcap

import (
	"encoding/binary"
	"sync/atomic"
)

// ring is a single-producer, single-consumer byte ring of variable-length
// records: an 16-byte header (timestamp ns, captured length, original
// length) and the captured bytes, contiguous. A record that would cross the
// end of the buffer starts again at offset 0; the producer marks the unused
// tail with a pad record when there is room for a header, and the consumer
// skips a tail too short for one.
//
// head and tail are byte positions that only grow; tail-head is the fill.
// The producer publishes a record with one atomic store of tail after
// writing it, the consumer frees space with one store of head after
// reading, so neither ever sees a half-written record.
type ring struct {
	buf  []byte
	head atomic.Uint64 // consumer position
	_    [56]byte      // keep the producer's and consumer's words on separate cache lines
	tail atomic.Uint64 // producer position
}

// padMark in the captured-length field marks a pad record.
const padMark = ^uint32(0)

// put copies incl bytes of the frame (iov after skip bytes) into the ring.
// It reports false when there is no room.
func (r *ring) put(ts int64, iov [][]byte, skip, incl, orig int) bool {
	size := uint64(len(r.buf))
	tail := r.tail.Load()
	free := size - (tail - r.head.Load())
	need := uint64(recordHeaderLen + incl)
	p := tail % size
	waste := uint64(0)
	if p+need > size {
		waste = size - p
	}
	if waste+need > free {
		return false
	}
	if waste > 0 {
		if waste >= recordHeaderLen {
			binary.LittleEndian.PutUint32(r.buf[p+8:], padMark)
		}
		p = 0
	}
	binary.LittleEndian.PutUint64(r.buf[p:], uint64(ts))
	binary.LittleEndian.PutUint32(r.buf[p+12:], uint32(orig))
	dst := r.buf[p+recordHeaderLen : p+need]
	got := 0
	for _, b := range iov {
		if got == len(dst) {
			break
		}
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		got += copy(dst[got:], b[skip:])
		skip = 0
	}
	// A frame shorter than claimed (iov ran out) is recorded as captured.
	binary.LittleEndian.PutUint32(r.buf[p+8:], uint32(got))
	if got < len(dst) {
		need = uint64(recordHeaderLen + got)
	}
	r.tail.Store(tail + waste + need)
	return true
}

// consume hands every published record to fn, then frees their space.
// data is only valid during the call.
func (r *ring) consume(fn func(ts int64, incl, orig uint32, data []byte)) {
	size := uint64(len(r.buf))
	head := r.head.Load()
	tail := r.tail.Load()
	for head < tail {
		p := head % size
		if size-p < recordHeaderLen {
			head += size - p
			continue
		}
		incl := binary.LittleEndian.Uint32(r.buf[p+8:])
		if incl == padMark {
			head += size - p
			continue
		}
		ts := int64(binary.LittleEndian.Uint64(r.buf[p:]))
		orig := binary.LittleEndian.Uint32(r.buf[p+12:])
		start := p + recordHeaderLen
		fn(ts, incl, orig, r.buf[start:start+uint64(incl)])
		head += recordHeaderLen + uint64(incl)
	}
	r.head.Store(head)
}

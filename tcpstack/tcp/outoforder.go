package tcp

import (
	"time"

	"vunet/tcpstack/header"
)

// Out-of-order data from the guest, and SACK.
//
// Guest segments reach the host socket in order, straight from guest
// memory. A segment beyond a hole (the frame before it was lost on the
// way: a front-end that drops what its TX ring cannot take, a lossy link)
// used to be dropped, so one lost frame cost the guest everything it had
// in flight behind it, and a Linux guest without SACK recovers from that
// one segment per round trip or by retransmission timeout — which doubles
// on every timeout whose retransmissions alone get acknowledged (no RTT
// sample without timestamps), until a 1% loss rate stalls the connection
// for tens of seconds.
//
// So when the guest offers SACK, we accept it, keep what comes after a
// hole (copied out of guest memory: only out-of-order payload is copied),
// tell the guest with SACK blocks what we hold, and write it to the socket
// once the hole is filled. The guest's SACK-based recovery (RACK)
// retransmits just the hole. What does not fit (beyond oooSize after the
// hole, more separate ranges than oooRanges, or a table that holds
// oooMaxBuffers already) is dropped as before and not SACKed: the guest
// sends it again. A connection handed to another table leaves what it held
// behind; the guest, which has it SACKed, finds out by timeout (SACK
// reneging, RFC 2018 §8) — handing over is rare.

const (
	// oooSize is how far past the hole a connection keeps data: a power
	// of two (sequence numbers index the buffer modulo it).
	oooSize = 512 << 10
	// oooRanges is how many separate ranges a connection keeps; the SACK
	// option reports up to header.TCPMaxSACKBlocks of them.
	oooRanges = 8
	// oooMaxBuffers bounds the buffers a table has at once (memory:
	// oooMaxBuffers × oooSize); a buffer goes back to the table's pool as
	// soon as its connection's hole is filled.
	oooMaxBuffers = 32
)

// seqRange is the sequence space [start, end).
type seqRange struct{ start, end uint32 }

// oooBuf is a connection's out-of-order data.
type oooBuf struct {
	data   []byte // oooSize bytes; sequence s at data[s%oooSize]
	ranges [oooRanges]seqRange
	n      int // ranges in use, sorted, disjoint and not adjacent
	last   int // the range the latest segment went into: the first SACK block
	// fin is the sequence of a FIN a kept segment carried, or of a bare
	// FIN kept on its own (valid when hasFin): it is taken once
	// everything before it is written. finLast: the latest segment kept
	// was that bare FIN (its SACK block goes first).
	fin     uint32
	hasFin  bool
	finLast bool
}

// sackOK reports whether f negotiated SACK with the guest.
func (t *Table) sackOK(f *conn) bool { return f.guestSACK && !t.cfg.NoSACK }

// keepOutOfOrder keeps the payload of sg, which starts past the next byte
// f expects, for when the hole before it is filled. It reports whether
// anything of it was kept (and is SACKed).
func (t *Table) keepOutOfOrder(f *conn, sg *segment, frame [][]byte, skip int) bool {
	if !t.sackOK(f) {
		return false
	}
	if sg.payloadLen == 0 {
		return sg.flags.Has(header.TCPFlagFIN) && t.keepFin(f, sg.seq)
	}
	start := sg.seq
	end := start + uint32(sg.payloadLen)
	if limit := f.seqFromGuest + oooSize; seqGT(end, limit) {
		end = limit // what fits; the rest comes again
	}
	if !seqGT(end, start) {
		return false
	}
	whole := end == start+uint32(sg.payloadLen)
	o := f.ooo
	if o != nil && o.hasFin && seqGT(end, o.fin) {
		return false // past the end of the stream the guest announced
	}
	if o == nil {
		if o = t.oooGet(); o == nil {
			return false
		}
		f.ooo = o
	}
	if !o.add(start, end) {
		// This segment alone is dropped; what is kept stays, SACKed.
		return false
	}
	// Copy it in, in at most two pieces (the buffer wraps).
	payload := skip + sg.payloadOff
	for s := start; s != end; {
		i := int(s % oooSize)
		k := min(int(end-s), oooSize-i)
		header.CopyFromIovecs(o.data[i:i+k], frame, payload+int(s-start))
		s += uint32(k)
	}
	o.finLast = false
	if whole && sg.flags.Has(header.TCPFlagFIN) && !o.hasFin {
		// Without it, the guest would send the FIN again only after its
		// retransmission timeout, once the hole is filled.
		o.fin, o.hasFin = end, true
	}
	t.stats.OutOfOrderKept.Add(uint64(end - start))
	return true
}

// keepFin keeps a bare FIN at seq past the hole, as keepOutOfOrder keeps
// one that comes with data: a guest that closes after data the socket took
// only in part (a hole we made) sends its FIN on its own, and without it
// would send it again only after its retransmission timeout (200 ms or
// more), once the hole is filled. It is SACKed at the end of the kept
// range it follows, or in a block of its own.
func (t *Table) keepFin(f *conn, seq uint32) bool {
	if !seqLT(seq, f.seqFromGuest+oooSize) {
		return false
	}
	o := f.ooo
	if o != nil && o.hasFin {
		return o.fin == seq // the same FIN again
	}
	if o != nil && o.n > 0 && seqGT(o.ranges[o.n-1].end, seq) {
		return false // data kept past it: not the end of this stream
	}
	if o == nil {
		if o = t.oooGet(); o == nil {
			return false
		}
		f.ooo = o
	}
	o.fin, o.hasFin, o.finLast = seq, true, true
	if o.n > 0 && o.ranges[o.n-1].end == seq {
		// It ends the last kept range, whose block now reports it: that
		// block goes first (RFC 2018 §4: the latest segment's block).
		o.last = o.n - 1
	}
	return true
}

// add records [start, end), merging it with the ranges it touches; false
// when it would need more than oooRanges ranges.
func (o *oooBuf) add(start, end uint32) bool {
	i := 0
	for i < o.n && seqLT(o.ranges[i].end, start) {
		i++
	}
	j := i
	for j < o.n && !seqGT(o.ranges[j].start, end) {
		start = seqMin(start, o.ranges[j].start)
		end = seqMax(end, o.ranges[j].end)
		j++
	}
	if i == j { // touches none: a new range at i
		if o.n == oooRanges {
			return false
		}
		copy(o.ranges[i+1:o.n+1], o.ranges[i:o.n])
		o.n++
	} else { // ranges i..j-1 become one
		copy(o.ranges[i+1:], o.ranges[j:o.n])
		o.n -= j - i - 1
	}
	o.ranges[i] = seqRange{start, end}
	o.last = i
	return true
}

// trim forgets what lies before next (written, or sent again in order).
func (o *oooBuf) trim(next uint32) {
	k := 0
	for i := 0; i < o.n; i++ {
		r := o.ranges[i]
		if !seqGT(r.end, next) {
			continue
		}
		if seqLT(r.start, next) {
			r.start = next
		}
		if i == o.last {
			o.last = k
		}
		o.ranges[k] = r
		k++
	}
	o.n = k
	if o.last >= k {
		o.last = 0
	}
}

// writeOutOfOrder writes what f kept that now follows the data written
// (the hole is filled) to the socket, and gives the buffer back once
// empty. A full socket keeps the rest for EPOLLOUT.
func (t *Table) writeOutOfOrder(now time.Time, f *conn) {
	o := f.ooo
	if o == nil {
		return
	}
	o.trim(f.seqFromGuest)
	for o.n > 0 && o.ranges[0].start == f.seqFromGuest && f.fd >= 0 {
		r := o.ranges[0]
		i := int(r.start % oooSize)
		k := min(int(r.end-r.start), oooSize-i)
		bufs := t.oooIov[:1]
		bufs[0] = o.data[i : i+k]
		if k < int(r.end-r.start) {
			bufs = t.oooIov[:2]
			bufs[1] = o.data[:int(r.end-r.start)-k]
		}
		n, ok := t.toSocket(now, f, bufs, 0, int(r.end-r.start))
		if !ok {
			return
		}
		f.flags |= flAckDue
		t.markDirty(f)
		o.trim(f.seqFromGuest)
		if n < int(r.end-r.start) {
			return // the rest at EPOLLOUT
		}
	}
	if o.n == 0 {
		if o.hasFin && seqGT(o.fin, f.seqFromGuest) {
			return // a bare FIN waits for the rest of the hole before it
		}
		fin := o.hasFin && o.fin == f.seqFromGuest && !f.has(evGuestFin)
		t.oooDrop(f)
		if fin {
			t.guestFin(now, f)
		}
	}
}

// oooReady reports whether f keeps data that follows what was written:
// its hole is filled, and only the socket's room holds it back.
func (f *conn) oooReady() bool {
	return f.ooo != nil && f.ooo.n > 0 && f.ooo.ranges[0].start == f.seqFromGuest
}

// sackBlocks puts f's kept ranges in o: the latest first, then the others
// in order (RFC 2018 §4).
func (t *Table) sackBlocks(f *conn, o *header.TCPOptions) {
	b := f.ooo
	o.NumSACKBlocks = 0
	if b == nil || (b.n == 0 && !b.hasFin) {
		return
	}
	finAlone := b.hasFin // a FIN that ends no kept range has a block of its own
	add := func(r seqRange) {
		if o.NumSACKBlocks < header.TCPMaxSACKBlocks {
			end := r.end
			if b.hasFin && end == b.fin {
				// The kept FIN's sequence number is SACKed with its data,
				// as a kernel's block ends: the guest's segment ends there,
				// and a block short of it leaves it unSACKed.
				end++
			}
			o.SACKBlocks[o.NumSACKBlocks] = header.TCPSACKBlock{Start: r.start, End: end}
			o.NumSACKBlocks++
		}
	}
	for i := 0; i < b.n; i++ {
		if b.ranges[i].end == b.fin {
			finAlone = false
		}
	}
	fin := seqRange{b.fin, b.fin} // add makes it [fin, fin+1)
	if finAlone && b.finLast {
		add(fin)
	}
	if b.n > 0 {
		add(b.ranges[b.last])
	}
	for i := 0; i < b.n; i++ {
		if i != b.last {
			add(b.ranges[i])
		}
	}
	if finAlone && !b.finLast {
		add(fin)
	}
}

// oooGet takes a buffer from the table's pool, making one if the table
// holds fewer than oooMaxBuffers; nil when it holds that many.
func (t *Table) oooGet() *oooBuf {
	if n := len(t.oooPool); n > 0 {
		o := t.oooPool[n-1]
		t.oooPool = t.oooPool[:n-1]
		t.oooLive++
		return o
	}
	if t.oooLive >= oooMaxBuffers {
		t.stats.OutOfOrderNoBuffer.Add(1)
		return nil
	}
	t.oooLive++
	return &oooBuf{data: make([]byte, oooSize)}
}

// oooDrop gives f's buffer back to the pool, forgetting what it held.
func (t *Table) oooDrop(f *conn) {
	o := f.ooo
	if o == nil {
		return
	}
	f.ooo = nil
	o.n, o.last, o.hasFin, o.finLast = 0, 0, false, false
	t.oooLive--
	t.oooPool = append(t.oooPool, o)
}

func seqMin(a, b uint32) uint32 {
	if seqLT(b, a) {
		return b
	}
	return a
}

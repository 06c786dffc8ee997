package virtqueue

// A queue's part in dirty-page logging (see dirty_log.go). A queue writes
// guest memory in two places: the used ring (elements, idx, flags and
// avail_event) and the device-writable buffers of the chains it returns
// (RX frames and their virtio-net headers, written by the caller through
// Chain.Writable). Both are marked here, when the queue publishes them, so
// callers need not know about logging:
//
//   - Push re-walks the descriptors of the chain it returns and marks the
//     writable buffers, up to the length written. The driver does not
//     touch a chain it made available until it is used, so the walk sees
//     the descriptors Pop saw; a driver that rewrites them anyway only
//     loses its own migration.
//   - Flush, and every store to used.flags or avail_event, marks the
//     whole used ring at its log address (a handful of pages even for a
//     32768-entry ring: a few atomic ORs). Elements staged by Push become
//     meaningful only with the used.idx store, and Flush follows every
//     Push before the ring stops (GET_VRING_BASE), which is when the
//     front-end reads the log for the last time.
//
// With logging off, q.dirty is nil and each of those places costs one
// predictable branch.

// LogConfig turns dirty logging on for a queue (Config.Log).
type LogConfig struct {
	Log *DirtyLog // the front-end's bitmap; required
	// UsedGPA is where the used ring is logged (SET_VRING_ADDR's
	// log_guest_addr): the guest-physical address of its first byte.
	// LogUsed says whether to log the used ring at all (VHOST_VRING_F_LOG).
	UsedGPA uint64
	LogUsed bool
}

// ringLog is a queue's logging state.
type ringLog struct {
	dl      *DirtyLog
	usedGPA uint64
	usedLen uint64 // 0: the used ring is not logged
	stats   *Stats
}

func newRingLog(cfg *LogConfig, size uint16, eventIdx bool, st *Stats) *ringLog {
	if cfg == nil || cfg.Log == nil {
		return nil
	}
	l := &ringLog{dl: cfg.Log, usedGPA: cfg.UsedGPA, stats: st}
	if cfg.LogUsed {
		l.usedLen = UsedRingSize(size)
		if !eventIdx {
			l.usedLen -= 2 // no avail_event
		}
	}
	return l
}

// mark logs one write and counts it.
func (l *ringLog) mark(gpa, n uint64) {
	l.stats.DirtyLogWrites.Add(1)
	if !l.dl.Mark(gpa, n) {
		l.stats.DirtyLogMisses.Add(1)
	}
}

// Logging reports whether the queue marks its writes in a dirty log.
func (q *SplitQueue) Logging() bool { return q.dirty != nil }

// logUsedRing marks the used ring (q.dirty != nil).
func (q *SplitQueue) logUsedRing() {
	if q.dirty.usedLen != 0 {
		q.dirty.mark(q.dirty.usedGPA, q.dirty.usedLen)
	}
}

// logWritten marks the writable buffers of the chain at head, in chain
// order, up to written bytes (q.dirty != nil). Only what Pop would accept is
// followed; anything else ends the walk (a driver that changed its
// descriptors after making them available).
func (q *SplitQueue) logWritten(head uint16, written uint32) {
	if written == 0 {
		return
	}
	q.logChainIn(q.desc, uint32(head), uint32(q.size), uint64(written), q.indirect)
}

// logChainIn walks a chain from idx in table (n entries), marking writable
// buffers until rest bytes are covered, and returns the bytes not covered.
// indirectOK: an indirect descriptor may be followed (not inside one).
func (q *SplitQueue) logChainIn(table []byte, idx, n uint32, rest uint64, indirectOK bool) uint64 {
	for count := uint32(0); count < n && rest > 0; count++ {
		d := readDesc(table, idx)
		if d.flags&DescFlagIndirect != 0 {
			if !indirectOK || d.len == 0 || d.len%descSize != 0 || d.len/descSize > MaxIndirectDescs {
				return rest
			}
			t, err := q.mem.guestSlice(d.addr, uint64(d.len))
			if err != nil {
				return rest
			}
			return q.logChainIn(t, 0, d.len/descSize, rest, false)
		}
		if d.flags&DescFlagWrite != 0 && d.len > 0 {
			k := min(uint64(d.len), rest)
			q.dirty.mark(d.addr, k)
			rest -= k
		}
		if d.flags&DescFlagNext == 0 {
			return rest
		}
		idx = uint32(d.next)
		if idx >= n {
			return rest
		}
	}
	return rest
}

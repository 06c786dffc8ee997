package virtqueue

import (
	"encoding/binary"
	"errors"
	"math"
)

// Limits applied to every descriptor chain. A chain that exceeds one is a
// bad chain (returned to the guest with length 0), not an error of the queue.
const (
	// MaxChainSegments is the capacity of a Chain's iovec storage, after
	// buffers crossing region boundaries were split. Linux guests use at
	// most MAX_SKB_FRAGS+2 (19 by default, 47 at the CONFIG maximum)
	// descriptors per frame, DPDK fewer; 128 leaves room for splits while
	// keeping a Chain at about 3 KiB so callers can keep batches of them.
	MaxChainSegments = 128
	// MaxIndirectDescs caps the entries of one indirect table. The spec
	// bounds a chain by the queue size; QEMU accepts at most 1024 and so
	// do we, whatever the ring size.
	MaxIndirectDescs = 1024
	// MaxChainBytes caps the total length of a chain, readable plus
	// writable. Lengths then fit an int on every platform and the used
	// element's u32 length, and absurd lengths like 0xffffffff are refused
	// even when memory happens to be large enough.
	MaxChainBytes = math.MaxInt32
)

// Chain is one descriptor chain taken from the available ring. Readable and
// Writable point into guest memory: they are valid until the chain is
// pushed, and the guest may change the bytes under us at any time, so copy
// anything that is parsed before checking it.
//
// A Chain is large (fixed storage so Pop never allocates); allocate it once
// and reuse it.
type Chain struct {
	Head     uint16   // descriptor index to Push back
	Readable [][]byte // device-readable buffers, in chain order (TX frame)
	Writable [][]byte // device-writable buffers, in chain order (RX buffer)

	descs int // descriptors walked, indirect entries included
	segs  [MaxChainSegments][]byte
}

// ReadableLen returns the total length of the readable buffers.
func (c *Chain) ReadableLen() int {
	n := 0
	for _, b := range c.Readable {
		n += len(b)
	}
	return n
}

// WritableLen returns the total length of the writable buffers.
func (c *Chain) WritableLen() int {
	n := 0
	for _, b := range c.Writable {
		n += len(b)
	}
	return n
}

// CopyReadable copies readable bytes, starting off bytes into the chain's
// readable part, into dst and returns how many were copied (less than
// len(dst) when the chain ends first; 0 for off < 0 or past the end). It is
// the way to take headers out of guest memory before parsing them, since
// the guest can rewrite the buffers at any time.
func (c *Chain) CopyReadable(dst []byte, off int) int {
	return copyFrom(dst, c.Readable, off)
}

// CopyToWritable copies src into the chain's writable part starting off
// bytes in, across buffer boundaries, and returns how many bytes fit.
func (c *Chain) CopyToWritable(off int, src []byte) int {
	if off < 0 {
		return 0
	}
	n := 0
	for _, b := range c.Writable {
		if len(src) == 0 {
			break
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		k := copy(b[off:], src)
		src = src[k:]
		n += k
		off = 0
	}
	return n
}

func copyFrom(dst []byte, bufs [][]byte, off int) int {
	if off < 0 {
		return 0
	}
	n := 0
	for _, b := range bufs {
		if len(dst) == 0 {
			break
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		k := copy(dst, b[off:])
		dst = dst[k:]
		n += k
		off = 0
	}
	return n
}

// Descriptors returns how many descriptors the chain consisted of, counting
// the entries of an indirect table (not the descriptor pointing to it).
func (c *Chain) Descriptors() int { return c.descs }

func (c *Chain) reset() {
	c.Head = 0
	c.Readable = nil
	c.Writable = nil
	c.descs = 0
}

// desc is one descriptor copied out of guest memory: the guest can rewrite
// the table while we look at it, so every field is read exactly once.
type desc struct {
	addr  uint64
	len   uint32
	flags uint16
	next  uint16
}

const descSize = 16

func readDesc(table []byte, i uint32) desc {
	b := table[i*descSize : i*descSize+descSize]
	return desc{
		addr:  binary.LittleEndian.Uint64(b[0:]),
		len:   binary.LittleEndian.Uint32(b[8:]),
		flags: binary.LittleEndian.Uint16(b[12:]),
		next:  binary.LittleEndian.Uint16(b[14:]),
	}
}

// badReason says why a chain was refused; it is logged, and it keeps the
// failure path free of allocations until the rate limiter lets a line out.
type badReason uint8

const (
	badNone badReason = iota
	badTooLong
	badNextRange
	badOutOfMemory
	badWraps
	badTooManySegments
	badTooManyBytes
	badReadAfterWrite
	badIndirectNotNegotiated
	badIndirectWithNext
	badIndirectNested
	badIndirectSize
	badIndirectMemory
)

var badReasonText = [...]string{
	badNone:                  "none",
	badTooLong:               "chain longer than the ring (loop?)",
	badNextRange:             "next index out of range",
	badOutOfMemory:           "buffer outside guest memory",
	badWraps:                 "buffer address+length wraps",
	badTooManySegments:       "too many segments",
	badTooManyBytes:          "chain longer than MaxChainBytes",
	badReadAfterWrite:        "readable descriptor after writable",
	badIndirectNotNegotiated: "indirect descriptor without INDIRECT_DESC",
	badIndirectWithNext:      "indirect descriptor with NEXT",
	badIndirectNested:        "nested indirect descriptor",
	badIndirectSize:          "indirect table length not a multiple of 16, empty or too long",
	badIndirectMemory:        "indirect table outside guest memory or across regions",
}

// String returns the reason as logged.
func (r badReason) String() string {
	if int(r) < len(badReasonText) {
		return badReasonText[r]
	}
	return "unknown"
}

var errTooManySegments = errors.New("too many segments")

// walker accumulates one chain. It lives on Pop's stack.
type walker struct {
	mem      *Memory
	c        *Chain
	nread    int // readable segments so far (they come first in c.segs)
	bytes    uint64
	writing  bool
	badAddr  uint64 // the offending descriptor, for the log
	badLen   uint32
	badIndex uint32
}

// add appends one descriptor's buffer. Zero-length descriptors contribute
// nothing: they are harmless and some drivers produce them.
func (w *walker) add(d desc, idx uint32) badReason {
	write := d.flags&DescFlagWrite != 0
	if !write && w.writing {
		return w.bad(d, idx, badReadAfterWrite)
	}
	w.writing = write
	w.c.descs++
	if d.len == 0 {
		return badNone
	}
	w.bytes += uint64(d.len)
	if w.bytes > MaxChainBytes {
		return w.bad(d, idx, badTooManyBytes)
	}
	n := len(w.c.Writable) // Writable is the tail of the segment storage
	all := w.c.segs[: w.nread+n : MaxChainSegments]
	all, err := w.mem.appendGuest(all, d.addr, uint64(d.len), true)
	switch err {
	case nil:
	case ErrRangeWraps:
		return w.bad(d, idx, badWraps)
	case errTooManySegments:
		return w.bad(d, idx, badTooManySegments)
	default:
		return w.bad(d, idx, badOutOfMemory)
	}
	if write {
		w.c.Writable = all[w.nread:len(all):len(all)]
	} else {
		w.nread = len(all)
	}
	return badNone
}

func (w *walker) bad(d desc, idx uint32, r badReason) badReason {
	w.badAddr, w.badLen, w.badIndex = d.addr, d.len, idx
	return r
}

// walk follows the chain starting at head in the descriptor table.
// Loops are caught by counting: a chain cannot have more descriptors than
// the table has entries.
func (w *walker) walk(table []byte, head uint16, size uint32, indirectOK bool) badReason {
	idx := uint32(head)
	for count := uint32(0); ; count++ {
		if count >= size {
			return w.bad(desc{}, idx, badTooLong)
		}
		d := readDesc(table, idx)
		if d.flags&DescFlagIndirect != 0 {
			if !indirectOK {
				return w.bad(d, idx, badIndirectNotNegotiated)
			}
			if d.flags&DescFlagNext != 0 {
				return w.bad(d, idx, badIndirectWithNext)
			}
			return w.walkIndirect(d, idx)
		}
		if r := w.add(d, idx); r != badNone {
			return r
		}
		if d.flags&DescFlagNext == 0 {
			return badNone
		}
		idx = uint32(d.next)
		if idx >= size {
			return w.bad(d, idx, badNextRange)
		}
	}
}

// walkIndirect follows an indirect table. The table must lie in one region:
// we read it as one contiguous slice. Its WRITE flag is ignored (spec
// 2.7.5.3.2), its entries may not be indirect themselves.
func (w *walker) walkIndirect(d desc, idx uint32) badReason {
	if d.len == 0 || d.len%descSize != 0 || d.len/descSize > MaxIndirectDescs {
		return w.bad(d, idx, badIndirectSize)
	}
	table, err := w.mem.guestSlice(d.addr, uint64(d.len))
	if err != nil {
		return w.bad(d, idx, badIndirectMemory)
	}
	n := d.len / descSize
	i := uint32(0)
	for count := uint32(0); ; count++ {
		if count >= n {
			return w.bad(d, i, badTooLong)
		}
		e := readDesc(table, i)
		if e.flags&DescFlagIndirect != 0 {
			return w.bad(e, i, badIndirectNested)
		}
		if r := w.add(e, i); r != badNone {
			return r
		}
		if e.flags&DescFlagNext == 0 {
			return badNone
		}
		i = uint32(e.next)
		if i >= n {
			return w.bad(e, i, badNextRange)
		}
	}
}

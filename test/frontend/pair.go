package frontend

import (
	"errors"
	"fmt"
	"time"
)

// ChainShape says how one frame (TX) or one receive buffer (RX) is cut into
// descriptors. The zero value is Linux's layout: one descriptor holding the
// virtio-net header and the frame.
type ChainShape struct {
	// Indirect puts the chain in an indirect table behind one ring descriptor.
	Indirect bool
	// HeaderApart gives the virtio-net header its own first descriptor, as
	// DPDK's virtio-user and legacy drivers do.
	HeaderApart bool
	// Chunk > 0 cuts the remaining bytes into descriptors of at most Chunk
	// bytes, so headers and payloads straddle descriptor boundaries.
	Chunk int
}

// pieces returns the descriptor lengths for total bytes.
func (s ChainShape) pieces(total, hdrLen int) []int {
	var out []int
	rest := total
	if s.HeaderApart && total > hdrLen {
		out = append(out, hdrLen)
		rest -= hdrLen
	}
	if s.Chunk <= 0 {
		return append(out, rest)
	}
	for rest > 0 {
		n := min(rest, s.Chunk)
		out = append(out, n)
		rest -= n
	}
	if len(out) == 0 {
		out = append(out, 0)
	}
	return out
}

// Frame is one received packet.
type Frame struct {
	Hdr     NetHdr
	Data    []byte // Ethernet frame, header stripped
	Buffers int    // used elements it took (MRG_RXBUF)
}

// Pair is one queue pair: RX ring 2*Index and TX ring 2*Index+1.
//
// The RX methods (PostRX, FillRX, ReceiveRX) and the TX methods (SubmitTX,
// SubmitTXHdr, ReclaimTX, WaitTX) touch disjoint state, so one goroutine may
// receive while another sends; each side is single-goroutine.
type Pair struct {
	Index  int
	RX, TX *Ring
	// TXShape and RXShape can be changed between calls.
	TXShape, RXShape ChainShape

	mem *Memory
	asm rxAssembler
}

// HdrLen is the virtio-net header length in use.
func (p *Pair) HdrLen() int { return p.asm.hdrLen }

// PostRX makes n receive buffers of bufSize bytes each available and kicks
// the RX ring. It posts what fits and returns ErrRingFull if not all did.
func (p *Pair) PostRX(n, bufSize int) error {
	if bufSize <= 0 {
		return fmt.Errorf("post rx: buffer size %d", bufSize)
	}
	var err error
	for i := 0; i < n; i++ {
		if err = p.postOne(bufSize); err != nil {
			break
		}
	}
	if _, perr := p.RX.Publish(); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return fmt.Errorf("post rx on ring %d: %w", p.RX.Index, err)
	}
	return nil
}

// FillRX posts bufSize buffers until the RX ring is full and returns how
// many it posted.
func (p *Pair) FillRX(bufSize int) (int, error) {
	n := 0
	for {
		if err := p.postOne(bufSize); err != nil {
			if _, perr := p.RX.Publish(); perr != nil {
				return n, perr
			}
			if errors.Is(err, ErrRingFull) {
				return n, nil
			}
			return n, err
		}
		n++
	}
}

func (p *Pair) postOne(bufSize int) error {
	lens := p.RXShape.pieces(bufSize, p.asm.hdrLen)
	if !p.RXShape.Indirect && len(lens) > p.RX.NumFree() {
		return ErrRingFull
	}
	gpa, err := p.mem.Alloc(uint64(bufSize), 8)
	if err != nil {
		return err
	}
	bufs := make([]Buffer, len(lens))
	off := uint64(0)
	for i, l := range lens {
		bufs[i] = Buffer{GPA: gpa + off, Len: uint32(l), Write: true}
		off += uint64(l)
	}
	if _, err := p.RX.addChain(bufs, p.RXShape.Indirect, []extent{{gpa, gpa + uint64(bufSize)}}); err != nil {
		p.mem.Free(gpa, uint64(bufSize))
		return err
	}
	return nil
}

// SubmitTX sends frames with a zero virtio-net header (no offloads).
func (p *Pair) SubmitTX(frames ...[]byte) error {
	return p.SubmitTXHdr(NetHdr{}, frames...)
}

// SubmitTXHdr sends frames, each behind header h, as one batch: all chains
// are added, then avail.idx is published once and the ring kicked if the
// device wants it. Used TX chains are reclaimed first to make room.
func (p *Pair) SubmitTXHdr(h NetHdr, frames ...[]byte) error {
	if _, err := p.ReclaimTX(); err != nil {
		return err
	}
	var err error
	for _, fr := range frames {
		if err = p.submitOne(h, fr); err != nil {
			break
		}
	}
	if _, perr := p.TX.Publish(); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return fmt.Errorf("submit tx on ring %d: %w", p.TX.Index, err)
	}
	return nil
}

func (p *Pair) submitOne(h NetHdr, frame []byte) error {
	hl := p.asm.hdrLen
	total := hl + len(frame)
	lens := p.TXShape.pieces(total, hl)
	if !p.TXShape.Indirect && len(lens) > p.TX.NumFree() {
		return ErrRingFull
	}
	gpa, err := p.mem.Alloc(uint64(total), 8)
	if err != nil {
		return err
	}
	b := make([]byte, total)
	h.Encode(b[:hl])
	copy(b[hl:], frame)
	if err := p.mem.Write(gpa, b); err != nil {
		p.mem.Free(gpa, uint64(total))
		return err
	}
	bufs := make([]Buffer, len(lens))
	off := uint64(0)
	for i, l := range lens {
		bufs[i] = Buffer{GPA: gpa + off, Len: uint32(l)}
		off += uint64(l)
	}
	if _, err := p.TX.addChain(bufs, p.TXShape.Indirect, []extent{{gpa, gpa + uint64(total)}}); err != nil {
		p.mem.Free(gpa, uint64(total))
		return err
	}
	return nil
}

// ReclaimTX frees every TX chain the device has returned and reports how
// many there were.
func (p *Pair) ReclaimTX() (int, error) {
	u, err := p.TX.Reclaim()
	return len(u), err
}

// WaitTX waits until no TX chain is outstanding (every submitted frame was
// returned used) and reclaims them.
func (p *Pair) WaitTX(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := p.ReclaimTX(); err != nil {
			return err
		}
		if p.TX.Outstanding() == 0 {
			return nil
		}
		if err := p.TX.WaitCall(time.Until(deadline)); err != nil {
			return fmt.Errorf("%d tx chains outstanding: %w", p.TX.Outstanding(), err)
		}
	}
}

// ReceiveRX returns the frames the device has completed, waiting up to
// timeout for at least one. A frame spread over several buffers (MRG_RXBUF)
// is returned once all of them are used.
func (p *Pair) ReceiveRX(timeout time.Duration) ([]Frame, error) {
	deadline := time.Now().Add(timeout)
	var frames []Frame
	for {
		for {
			u, ok, err := p.RX.PopUsed()
			if !ok {
				break
			}
			if err != nil {
				return frames, err
			}
			data, err := p.takeRX(u)
			if err != nil {
				return frames, err
			}
			f, done, err := p.asm.add(data)
			if err != nil {
				return frames, fmt.Errorf("ring %d: %w", p.RX.Index, err)
			}
			if done {
				frames = append(frames, f)
			}
		}
		if len(frames) > 0 {
			return frames, nil
		}
		if err := p.RX.WaitCall(time.Until(deadline)); err != nil {
			return nil, err
		}
	}
}

// takeRX copies out the bytes the device wrote into a used RX chain and
// frees the chain.
func (p *Pair) takeRX(u Used) ([]byte, error) {
	c := p.RX.release(uint16(u.ID))
	defer p.RX.freeChain(c)
	var capacity uint64
	for _, b := range c.bufs {
		capacity += uint64(b.Len)
	}
	if uint64(u.Len) > capacity {
		return nil, fmt.Errorf("ring %d: device wrote %d bytes into a %d-byte chain", p.RX.Index, u.Len, capacity)
	}
	out := make([]byte, u.Len)
	off := 0
	for _, b := range c.bufs {
		if off == len(out) {
			break
		}
		n := min(int(b.Len), len(out)-off)
		if err := p.mem.Read(b.GPA, out[off:off+n]); err != nil {
			return nil, err
		}
		off += n
	}
	return out, nil
}

// rxAssembler turns used RX buffers into frames, following num_buffers when
// MRG_RXBUF is negotiated.
type rxAssembler struct {
	hdrLen int
	mrg    bool
	cur    *Frame
	want   int
}

func (a *rxAssembler) add(data []byte) (Frame, bool, error) {
	if a.cur == nil {
		h, err := DecodeNetHdr(data, a.hdrLen)
		if err != nil {
			return Frame{}, false, fmt.Errorf("rx buffer of %d bytes: %w", len(data), err)
		}
		nb := 1
		if a.mrg {
			nb = int(h.NumBuffers)
			if nb == 0 {
				return Frame{}, false, errors.New("rx: num_buffers is 0")
			}
		}
		a.cur = &Frame{Hdr: h, Data: append([]byte(nil), data[a.hdrLen:]...), Buffers: 1}
		a.want = nb - 1
	} else {
		a.cur.Data = append(a.cur.Data, data...)
		a.cur.Buffers++
		a.want--
	}
	if a.want > 0 {
		return Frame{}, false, nil
	}
	f := *a.cur
	a.cur = nil
	return f, true, nil
}

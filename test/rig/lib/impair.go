package rig

import (
	"math/rand/v2"
	"sync/atomic"

	"vunet/test/frontend"
)

// A lossy link between the guest and the back-end, made by the rig's own
// front-end: netem would do it on a real link, but this host's kernel has
// no netem, and loss between a guest and vunet is real with front-ends
// that forward without back-pressure (DPDK's testpmd) or when a guest's RX
// ring runs dry. Each frame, each way, is lost, duplicated or reordered
// (held back and delivered after the next frame) with the probabilities
// given, drawn from a generator seeded per direction and ring, so a seed
// damages the same frames of the same traffic.

// Impairment says how often frames are damaged, each way; the zero value
// damages nothing.
type Impairment struct {
	Loss, Reorder, Duplicate float64 // probabilities, 0..1, per frame
	// Seed seeds the generators (0: 1).
	Seed uint64
}

// On reports whether the impairment damages anything.
func (im Impairment) On() bool { return im.Loss > 0 || im.Reorder > 0 || im.Duplicate > 0 }

// ImpairStats counts what an impairment did in one direction.
type ImpairStats struct {
	Frames, Lost, Duplicated, Reordered atomic.Uint64
}

// impairer is one direction's (or one RX ring's) generator, and the frame
// it holds back to reorder. One goroutine uses it.
type impairer struct {
	im  Impairment
	rng *rand.Rand
	st  *ImpairStats

	// TX: a descriptor filled and not posted yet.
	held     bool
	heldID   uint16
	heldN    int
	heldPair int
	// RX: a frame's used buffers not written yet.
	heldRX   []uint16
	heldLens []uint32
}

func newImpairer(im Impairment, seed, stream uint64, st *ImpairStats) impairer {
	if im.Seed != 0 {
		seed = im.Seed
	}
	if seed == 0 {
		seed = 1
	}
	return impairer{im: im, rng: rand.New(rand.NewPCG(seed, stream)), st: st}
}

// what draws the fate of the next frame.
type fate uint8

const (
	fatePass fate = iota
	fateLose
	fateDuplicate
	fateReorder
)

func (p *impairer) draw() fate {
	if !p.im.On() {
		return fatePass
	}
	p.st.Frames.Add(1)
	r := p.rng.Float64()
	switch {
	case r < p.im.Loss:
		p.st.Lost.Add(1)
		return fateLose
	case r < p.im.Loss+p.im.Duplicate:
		return fateDuplicate // counted where the copy is made
	case r < p.im.Loss+p.im.Duplicate+p.im.Reorder:
		return fateReorder // counted where the frame is held back
	}
	return fatePass
}

// post posts the n-byte frame in descriptor id of pair's TX ring, as the
// impairment says, and returns how many descriptors it posted.
func (p *impairer) post(b *bridge, tx *frontend.FixedRing, id uint16, n, pair int) int {
	switch p.draw() {
	case fateLose:
		tx.Put(id)
		return 0
	case fateDuplicate:
		tx.Post(id, n)
		b.countTX(pair, n)
		if id2, ok := tx.Get(); ok {
			copy(tx.Buf(id2), tx.Buf(id)[:n])
			tx.Post(id2, n)
			b.countTX(pair, n)
			p.st.Duplicated.Add(1)
			return 2 + p.flush(b, tx, pair)
		}
		return 1 + p.flush(b, tx, pair)
	case fateReorder:
		if !p.held {
			p.held, p.heldID, p.heldN, p.heldPair = true, id, n, pair
			p.st.Reordered.Add(1)
			return 0
		}
	}
	tx.Post(id, n)
	b.countTX(pair, n)
	return 1 + p.flush(b, tx, pair)
}

// flush posts the descriptor held back, after what was posted since.
func (p *impairer) flush(b *bridge, tx *frontend.FixedRing, pair int) int {
	if !p.held || p.heldPair != pair {
		return 0
	}
	p.held = false
	tx.Post(p.heldID, p.heldN)
	b.countTX(pair, p.heldN)
	return 1
}

// deliver writes one received frame to the TAP as the impairment says;
// release gives buffers back once their frame is written or lost.
func (p *impairer) deliver(w *rxWriter, heads []uint16, lens []uint32, release func([]uint16)) {
	switch p.draw() {
	case fateLose:
		release(heads)
		return
	case fateDuplicate:
		w.write(heads, lens)
		w.write(heads, lens)
		p.st.Duplicated.Add(1)
		release(heads)
		p.flushRX(w, release)
		return
	case fateReorder:
		if p.heldRX == nil {
			p.heldRX = append(make([]uint16, 0, len(heads)), heads...)
			p.heldLens = append(make([]uint32, 0, len(lens)), lens...)
			p.st.Reordered.Add(1)
			return
		}
	}
	w.write(heads, lens)
	release(heads)
	p.flushRX(w, release)
}

// flushRX writes the frame held back, after what was written since.
func (p *impairer) flushRX(w *rxWriter, release func([]uint16)) {
	if p.heldRX == nil {
		return
	}
	w.write(p.heldRX, p.heldLens)
	release(p.heldRX)
	p.heldRX, p.heldLens = nil, nil
}

package flowdir

import (
	"hash/maphash"
	"runtime"
	"sync"
	"sync/atomic"
)

// MaxPairs bounds the pair indices a Dir has shards for (vhost-user offers
// at most 128 queue pairs).
const MaxPairs = 256

// Pairs is a set of pair indices below MaxPairs.
type Pairs [MaxPairs / 64]uint64

// Add puts pair p in the set (p out of range: nothing).
func (s *Pairs) Add(p int) {
	if p >= 0 && p < MaxPairs {
		s[p/64] |= 1 << (p % 64)
	}
}

// Has reports whether p is in the set.
func (s *Pairs) Has(p int) bool {
	return p >= 0 && p < MaxPairs && s[p/64]&(1<<(p%64)) != 0
}

// Dir is the directory: one Shard per pair.
type Dir struct {
	seed maphash.Seed

	mu     sync.Mutex // serialises shard creation only
	shards [MaxPairs]atomic.Pointer[Shard]
	n      atomic.Int32 // highest pair with a shard, plus one
}

// New returns an empty directory with a fresh random seed.
func New() *Dir { return &Dir{seed: maphash.MakeSeed()} }

// Sum returns the fingerprint of a flow key's bytes: a hash keyed with the
// directory's seed, never 0 (the empty slot).
func (d *Dir) Sum(key []byte) uint64 {
	h := maphash.Bytes(d.seed, key)
	if h == 0 {
		h = 1
	}
	return h
}

// Shard returns pair's shard, made on first use with room for capacity
// fingerprints; nil for a pair out of range.
func (d *Dir) Shard(pair, capacity int) *Shard {
	if pair < 0 || pair >= MaxPairs {
		return nil
	}
	if s := d.shards[pair].Load(); s != nil {
		return s
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.shards[pair].Load(); s != nil {
		return s
	}
	s := newShard(d, pair, capacity)
	d.shards[pair].Store(s)
	if int32(pair+1) > d.n.Load() {
		d.n.Store(int32(pair + 1))
	}
	return s
}

// Find returns a pair other than those in skip whose shard holds fp, the
// lowest such index. Any goroutine may call it; it takes no lock.
func (d *Dir) Find(fp uint64, skip *Pairs) (pair int, ok bool) {
	n := int(d.n.Load())
	for p := 0; p < n; p++ {
		if skip != nil && skip.Has(p) {
			continue
		}
		if s := d.shards[p].Load(); s != nil && s.Has(fp) {
			return p, true
		}
	}
	return 0, false
}

// Shard is one pair's published set of flow fingerprints. Add and Remove
// are for one goroutine at a time (the pair's loop, or the control path
// while no loop runs); Has is for any goroutine.
type Shard struct {
	dir  *Dir
	pair int

	// seq is odd while a removal moves entries; readers retry then and
	// when it changed under their probe.
	seq   atomic.Uint64
	slots []atomic.Uint64 // fingerprints, 0 = empty; linear probing
	mask  uint64
	n     int // entries, writer only
}

func newShard(d *Dir, pair, capacity int) *Shard {
	size := 16
	for size < 2*capacity {
		size *= 2
	}
	return &Shard{dir: d, pair: pair, slots: make([]atomic.Uint64, size), mask: uint64(size - 1)}
}

// Pair returns the shard's pair index.
func (s *Shard) Pair() int { return s.pair }

// Dir returns the directory the shard belongs to.
func (s *Shard) Dir() *Dir { return s.dir }

// Len returns the number of fingerprints held.
func (s *Shard) Len() int { return s.n }

// Add records fp (once more: a fingerprint held twice needs two Removes).
// It reports false when the shard is full (kept at most half full by its
// capacity, so only a caller that adds more than it said gets there): the
// flow is then not visible to the other pairs.
func (s *Shard) Add(fp uint64) bool {
	if fp == 0 || s.n >= len(s.slots)-len(s.slots)/4 {
		return false
	}
	for i := fp & s.mask; ; i = (i + 1) & s.mask {
		if s.slots[i].Load() == 0 {
			s.slots[i].Store(fp)
			s.n++
			return true
		}
	}
}

// Remove drops one occurrence of fp, if held. Entries after it in its
// probe run move back so no probe stops short (Knuth's algorithm R), with
// seq odd meanwhile.
func (s *Shard) Remove(fp uint64) {
	if fp == 0 {
		return
	}
	i := fp & s.mask
	for {
		v := s.slots[i].Load()
		if v == 0 {
			return // not held
		}
		if v == fp {
			break
		}
		i = (i + 1) & s.mask
	}
	s.seq.Add(1)
	for {
		j := i
		for {
			j = (j + 1) & s.mask
			v := s.slots[j].Load()
			if v == 0 {
				s.slots[i].Store(0)
				s.n--
				s.seq.Add(1)
				return
			}
			// v may move to the hole at i unless its home lies
			// cyclically in (i, j].
			h := v & s.mask
			if i <= j {
				if i < h && h <= j {
					continue
				}
			} else if i < h || h <= j {
				continue
			}
			s.slots[i].Store(v)
			i = j
			break
		}
	}
}

// Has reports whether fp is held. It takes no lock: a probe that a removal
// overlapped is run again.
func (s *Shard) Has(fp uint64) bool {
	for spins := 0; ; spins++ {
		seq := s.seq.Load()
		if seq&1 == 0 {
			found := s.probe(fp)
			if s.seq.Load() == seq {
				return found
			}
		}
		if spins > 64 {
			runtime.Gosched() // the writer was preempted mid-removal
		}
	}
}

func (s *Shard) probe(fp uint64) bool {
	for i, n := fp&s.mask, 0; n < len(s.slots); i, n = (i+1)&s.mask, n+1 {
		switch s.slots[i].Load() {
		case fp:
			return true
		case 0:
			return false
		}
	}
	return false
}

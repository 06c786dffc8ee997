package flowdir

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// TestShardMatchesMultiset: random adds and removes, with fingerprints
// crowded into few home slots so probe runs wrap and removals shift
// entries, agree with a plain multiset at every step.
func TestShardMatchesMultiset(t *testing.T) {
	d := New()
	s := d.Shard(0, 64)
	ref := map[uint64]int{}
	rng := rand.New(rand.NewPCG(1, 2))
	// Few distinct fingerprints, many sharing a home (low bits).
	fps := make([]uint64, 40)
	for i := range fps {
		fps[i] = uint64(rng.IntN(8))<<8 | uint64(rng.IntN(4)) | 1<<40
	}
	for step := 0; step < 5000; step++ {
		fp := fps[rng.IntN(len(fps))]
		if rng.IntN(2) == 0 && s.Len() < 90 {
			if !s.Add(fp) {
				t.Fatalf("step %d: Add refused with %d entries", step, s.Len())
			}
			ref[fp]++
		} else {
			s.Remove(fp)
			if ref[fp] > 0 {
				ref[fp]--
			}
		}
		n := 0
		for _, f := range fps {
			if got, want := s.Has(f), ref[f] > 0; got != want {
				t.Fatalf("step %d: Has(%#x) = %v, want %v", step, f, got, want)
			}
		}
		for _, c := range ref {
			n += c
		}
		if s.Len() != n {
			t.Fatalf("step %d: Len %d, want %d", step, s.Len(), n)
		}
	}
}

// TestShardFull: a shard refuses what it has no room for instead of
// filling up (a probe must always end at an empty slot).
func TestShardFull(t *testing.T) {
	s := New().Shard(1, 4)
	added := 0
	for fp := uint64(1); fp < 1000; fp++ {
		if s.Add(fp) {
			added++
		}
	}
	if added == 0 || added >= len(s.slots) {
		t.Fatalf("added %d into %d slots", added, len(s.slots))
	}
	if s.Add(0) {
		t.Error("Add(0) accepted: 0 is the empty slot")
	}
	for fp := uint64(1); fp <= uint64(added); fp++ {
		if !s.Has(fp) {
			t.Fatalf("%d lost", fp)
		}
	}
	if s.Has(5000) {
		t.Error("Has(5000) on a full shard")
	}
}

// TestFindSkipsPairs: Find names a pair holding the fingerprint, never one
// it was told to skip, and nothing for pairs without shards.
func TestFindSkipsPairs(t *testing.T) {
	d := New()
	a, b := d.Shard(1, 8), d.Shard(3, 8)
	if d.Shard(3, 8) != b || d.Shard(MaxPairs, 8) != nil || d.Shard(-1, 8) != nil {
		t.Fatal("Shard: not the same shard, or a shard out of range")
	}
	fp := d.Sum([]byte("flow"))
	if fp == 0 || fp != d.Sum([]byte("flow")) || fp == d.Sum([]byte("other")) {
		t.Fatal("Sum: not a stable, distinguishing fingerprint")
	}
	if _, ok := d.Find(fp, nil); ok {
		t.Fatal("found in an empty directory")
	}
	a.Add(fp)
	b.Add(fp)
	var skip Pairs
	if p, ok := d.Find(fp, &skip); !ok || p != 1 {
		t.Fatalf("Find = %d %v, want 1", p, ok)
	}
	skip.Add(1)
	if p, ok := d.Find(fp, &skip); !ok || p != 3 {
		t.Fatalf("Find skipping 1 = %d %v, want 3", p, ok)
	}
	skip.Add(3)
	if _, ok := d.Find(fp, &skip); ok {
		t.Fatal("found with every holder skipped")
	}
	a.Remove(fp)
	if p, ok := d.Find(fp, nil); !ok || p != 3 {
		t.Fatalf("Find after removal from 1 = %d %v, want 3", p, ok)
	}
}

// TestShardConcurrentReaders: readers on other goroutines always find the
// fingerprints that stay while the writer adds and removes others around
// them (run with -race: the data are atomics, the seqlock retries).
func TestShardConcurrentReaders(t *testing.T) {
	d := New()
	s := d.Shard(0, 256)
	const steady = 32
	stay := make([]uint64, steady)
	for i := range stay {
		// Homes interleaved with the churners', so removals shift across them.
		stay[i] = uint64(i*7)&s.mask | uint64(i+1)<<32
		s.Add(stay[i])
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var misses atomic.Int64
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for _, fp := range stay {
					if !s.Has(fp) {
						misses.Add(1)
					}
				}
				if _, ok := d.Find(stay[0], nil); !ok {
					misses.Add(1)
				}
			}
		}()
	}
	rng := rand.New(rand.NewPCG(3, 4))
	live := []uint64{}
	for step := 0; step < 20000; step++ {
		if len(live) < 150 && rng.IntN(2) == 0 {
			fp := uint64(rng.IntN(int(s.mask)+1)) | uint64(1000+step)<<32
			s.Add(fp)
			live = append(live, fp)
		} else if len(live) > 0 {
			i := rng.IntN(len(live))
			s.Remove(live[i])
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		}
	}
	stop.Store(true)
	wg.Wait()
	if m := misses.Load(); m != 0 {
		t.Fatalf("readers missed a fingerprint that stayed %d times", m)
	}
}

// BenchmarkFindMiss is the cost a loop pays for a frame whose flow it
// does not hold, with four pairs holding a thousand flows each.
func BenchmarkFindMiss(b *testing.B) {
	d := New()
	for p := 0; p < 4; p++ {
		s := d.Shard(p, 2048)
		for i := 0; i < 1000; i++ {
			s.Add(d.Sum([]byte{byte(p), byte(i), byte(i >> 8)}))
		}
	}
	key := []byte("a flow nobody has")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := d.Find(d.Sum(key), nil); ok {
			b.Fatal("found")
		}
	}
}

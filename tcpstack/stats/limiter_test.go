package stats

import (
	"sync"
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	var l Limiter
	t0 := time.Unix(1000, 0)
	if ok, n := l.Allow(t0, time.Second); !ok || n != 0 {
		t.Fatalf("first line held back (%v, %d)", ok, n)
	}
	for i := 1; i <= 3; i++ {
		if ok, _ := l.Allow(t0.Add(time.Duration(i)*100*time.Millisecond), time.Second); ok {
			t.Fatalf("line %d within the interval let through", i)
		}
	}
	if ok, n := l.Allow(t0.Add(time.Second), time.Second); !ok || n != 3 {
		t.Fatalf("after the interval: %v, suppressed %d, want true, 3", ok, n)
	}
	// Concurrent callers at one instant: exactly one line goes out.
	var wg sync.WaitGroup
	var mu sync.Mutex
	passed := 0
	t1 := t0.Add(time.Hour)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok, _ := l.Allow(t1, time.Second); ok {
				mu.Lock()
				passed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if passed != 1 {
		t.Errorf("%d concurrent lines let through, want 1", passed)
	}
	if n := testing.AllocsPerRun(100, func() { l.Allow(t1, time.Second) }); n != 0 {
		t.Errorf("%v allocs per Allow", n)
	}
}

package virtqueue_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"

	"vunet/virtqueue"
)

type countHandler struct {
	warn, errs atomic.Int32
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	switch {
	case r.Level >= slog.LevelError:
		h.errs.Add(1)
	case r.Level >= slog.LevelWarn:
		h.warn.Add(1)
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// A flood of bad chains logs one line, however many there are.
func TestBadChainLogRateLimited(t *testing.T) {
	r := newRig(t, rigOpt{size: 64})
	h := &countHandler{}
	r.cfg.Logger = slog.New(h)
	q, err := virtqueue.NewSplitQueue(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint16(50) {
		r.d.SetDesc(i, rigMem+uint64(i), 1, 0, 0)
		r.d.PutAvail(i)
	}
	r.d.Publish(false)
	var c virtqueue.Chain
	if ok, err := q.Pop(&c); ok || err != nil {
		t.Fatalf("Pop = %v, %v", ok, err)
	}
	if r.stats.BadChains.Load() != 50 {
		t.Fatalf("BadChains %d", r.stats.BadChains.Load())
	}
	if h.warn.Load() != 1 {
		t.Fatalf("%d warnings for 50 bad chains, want 1", h.warn.Load())
	}
	q.Flush()
	if r.d.UsedIdx() != 50 {
		t.Fatalf("used.idx %d", r.d.UsedIdx())
	}
}

func TestBrokenLogsOnce(t *testing.T) {
	r := newRig(t, rigOpt{size: 8})
	h := &countHandler{}
	r.cfg.Logger = slog.New(h)
	q, err := virtqueue.NewSplitQueue(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.d.SetAvailIdx(100)
	var c virtqueue.Chain
	for range 3 {
		if _, err := q.Pop(&c); !errors.Is(err, virtqueue.ErrBroken) {
			t.Fatal(err)
		}
	}
	if h.errs.Load() != 1 {
		t.Fatalf("%d error lines, want 1", h.errs.Load())
	}
}

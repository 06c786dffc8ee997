package vhostuser

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWarningsRateLimited: warnings a peer can provoke at will are logged
// once per interval (the errors are still all counted); the dirty-log flag
// warning comes once per session.
func TestWarningsRateLimited(t *testing.T) {
	const n = 50
	for _, tc := range []struct {
		name    string
		line    string
		provoke func(t *testing.T, h *harness, logs *logBuffer)
		errors  func(h *harness) uint64
		want    uint64 // errors counted
	}{
		{name: "ignored requests", line: "vhost-user request ignored",
			provoke: func(t *testing.T, h *harness, _ *logBuffer) {
				for i := 0; i < n; i++ {
					if _, _, err := h.do(Request(99), 0, nil); err != nil {
						t.Fatal(err)
					}
				}
			},
			errors: func(h *harness) uint64 { return h.stats.ErrorCount(ErrReasonUnsupported) }, want: n},
		{name: "failed requests", line: "vhost-user request failed",
			provoke: func(t *testing.T, h *harness, _ *logBuffer) {
				h.ok(ReqSetProtocolFeatures, u64(ProtocolReplyAck))
				for i := 0; i < n; i++ {
					if r, _, _ := h.do(ReqSetStatus, FlagNeedReply, u64(1000)); len(r) != 8 || r[0] != 1 {
						t.Fatalf("failure ack %x", r)
					}
				}
			},
			errors: func(h *harness) uint64 { return h.stats.ErrorCount(ErrReasonInvalid) }, want: n},
		{name: "dirty-log flag", line: "VHOST_VRING_F_LOG",
			provoke: func(t *testing.T, h *harness, _ *logBuffer) {
				g := newGuestMem(t, testGPA, testUA, testSize)
				h.ok(ReqAddMemReg, memReg(g.spec), g.dupFD(t))
				for i := 0; i < n; i++ {
					a := g.ringAddr(i % 2)
					a.Flags = VringFlagLog
					h.ok(ReqSetVringAddr, addr(a))
				}
			},
			errors: func(h *harness) uint64 { return h.stats.ErrorCount(ErrReasonInvalid) }, want: 0},
		{name: "rejected connections", line: "connection rejected",
			provoke: func(t *testing.T, h *harness, logs *logBuffer) {
				var limit logLimiter
				for i := 0; i < n; i++ {
					a, b := socketPair(t)
					rejectPeer(b, logs.logger(), h.stats, &limit, "a front-end is already connected")
					a.Close()
				}
			},
			errors: func(h *harness) uint64 { return h.stats.ErrorCount(ErrReasonRejected) }, want: n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuffer
			dp := newFakeDP()
			st := &Stats{}
			d := newDevice(DeviceConfig{QueuePairs: 1, DataPlane: dp, Logger: logs.logger(), Stats: st})
			h := &harness{t: t, d: d, dp: dp, stats: st}
			defer d.close()
			tc.provoke(t, h, &logs)
			if got := strings.Count(logs.String(), tc.line); got != 1 {
				t.Fatalf("%q logged %d times for %d occurrences, want once:\n%s", tc.line, got, n, logs.String())
			}
			if got := tc.errors(h); got != tc.want {
				t.Fatalf("errors counted %d, want %d", got, tc.want)
			}
		})
	}
}

func TestLogLimiter(t *testing.T) {
	var l logLimiter
	t0 := timeZero()
	steps := []struct {
		at         int // milliseconds
		ok         bool
		suppressed uint64
	}{
		{0, true, 0}, {10, false, 0}, {999, false, 0}, {1000, true, 2}, {1500, false, 0}, {2600, true, 1},
	}
	for _, s := range steps {
		ok, sup := l.allow(t0.Add(msec(s.at)))
		if ok != s.ok || sup != s.suppressed {
			t.Fatalf("at %dms: ok %v suppressed %d, want %v %d", s.at, ok, sup, s.ok, s.suppressed)
		}
	}
}

func timeZero() time.Time      { return time.Unix(1000, 0) }
func msec(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// TestLineLimiter: each message passes in a burst, then at the refill
// rate, and the next line that passes says how many were held back; other
// messages have their own budget.
func TestLineLimiter(t *testing.T) {
	l := &lineLimiter{buckets: map[string]*lineBucket{}}
	t0 := timeZero()
	for i := 0; i < lineBurst; i++ {
		if ok, _ := l.allow("a", t0); !ok {
			t.Fatalf("line %d of the burst held back", i)
		}
	}
	for i := 0; i < 5; i++ {
		if ok, _ := l.allow("a", t0.Add(msec(10*i))); ok {
			t.Fatalf("line %d past the burst passed", i)
		}
	}
	if ok, _ := l.allow("b", t0); !ok {
		t.Fatal("another message shares the budget")
	}
	if ok, sup := l.allow("a", t0.Add(msec(1000))); !ok || sup != 5 {
		t.Fatalf("after a second: ok %v suppressed %d, want true 5", ok, sup)
	}
	// The state stays bounded whatever the messages.
	for i := 0; i < 10*maxLineKinds; i++ {
		l.allow(string(rune('A'+i%26))+strconv.Itoa(i), t0)
	}
	if len(l.buckets) > maxLineKinds {
		t.Fatalf("%d buckets", len(l.buckets))
	}
}

// TestLimitedHandler: the handler passes records through with their
// attributes and loggers derived with With share the budget.
func TestLimitedHandler(t *testing.T) {
	var logs logBuffer
	log := limitLogger(logs.logger())
	if limitLogger(log) != log {
		t.Fatal("a limited logger was wrapped again")
	}
	derived := log.With("pair", 3)
	for i := 0; i < 1000; i++ {
		log.Info("queue pair started", "i", i)
		derived.Info("queue pair started", "i", i)
	}
	out := logs.String()
	if n := strings.Count(out, "queue pair started"); n != lineBurst {
		t.Fatalf("%d lines for 2000 records, want %d:\n%s", n, lineBurst, out)
	}
	if !strings.Contains(out, "pair=3") {
		t.Fatalf("derived logger's attributes lost:\n%s", out)
	}
}

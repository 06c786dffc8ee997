package hostile

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	fe "vunet/test/frontend"
	"vunet/vhostuser"
	"vunet/virtqueue"
)

// TestSilentConnectionTimesOut: the server serves one front-end at a time,
// so a connection that sends nothing, or stops in the middle of a message,
// held the slot forever. It is closed after the first-message (or
// message) timeout, counted, and the next front-end is served.
func TestSilentConnectionTimesOut(t *testing.T) {
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"nothing", nil},
		{"half a header", hdr(fe.ReqGetFeatures, 1, 0)[:6]},
		{"header without its payload", hdr(fe.ReqSetFeatures, 1, 8)},
		{"one message, then half a header", append(hdr(fe.ReqGetFeatures, 1, 0), hdr(fe.ReqGetFeatures, 1, 0)[:3]...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			isolate(t, func(t *testing.T) {
				s := startServerConfig(t, newARPPlane(), func(_ *vhostuser.ServerConfig, d *vhostuser.DeviceConfig) {
					d.FirstMessageTimeout = 300 * time.Millisecond
					d.MessageTimeout = 300 * time.Millisecond
				})
				squatter, err := fe.Dial(s.path)
				if err != nil {
					t.Fatal(err)
				}
				defer squatter.Close()
				if len(tc.send) > 0 {
					if err := squatter.SendRaw(tc.send, nil, nil); err != nil {
						t.Fatal(err)
					}
				}
				start := time.Now()
				f := s.connect(t, fe.Options{}) // retries while turned away
				t.Logf("served %v after the squatter connected", time.Since(start).Round(time.Millisecond))
				exchange(t, f)
				if n := s.stats.ErrorCount(vhostuser.ErrReasonTimeout); n != 1 {
					t.Errorf("timeout errors %d, want 1", n)
				}
			})
		})
	}
}

// slowStop is a data plane whose StopPair takes a while, as tearing down
// a busy pair does on a loaded machine.
type slowStop struct {
	virtqueue.DataPlane
	delay time.Duration
}

func (p slowStop) StopPair(i int) {
	time.Sleep(p.delay)
	p.DataPlane.StopPair(i)
}

// TestReconnectDuringTeardown: QEMU restarted at once connects while the
// previous session is still being torn down. It was turned away (39
// refusals in one loaded `make test` run of TestQEMUFrontendRestart); it
// waits for the teardown and is served, with nothing counted as rejected.
func TestReconnectDuringTeardown(t *testing.T) {
	isolate(t, func(t *testing.T) {
		s := startServerWith(t, slowStop{newARPPlane(), 500 * time.Millisecond})
		f := s.connect(t, fe.Options{})
		exchange(t, f)
		f.Close()
		// The next front-end connects once, no retry, while the pair of
		// the previous session is still stopping.
		time.Sleep(50 * time.Millisecond)
		g, err := fe.Dial(s.path)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		g.Conn.Timeout = 5 * time.Second
		if err := g.Negotiate(fe.Options{}); err != nil {
			t.Fatalf("front-end connecting during the teardown: %v", err)
		}
		exchange(t, g)
		if n := s.stats.ErrorCount(vhostuser.ErrReasonRejected); n != 0 {
			t.Errorf("%d connections rejected", n)
		}
		// A second front-end while one is active is still turned away.
		h, err := fe.Dial(s.path)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		h.Conn.Timeout = 2 * time.Second
		if _, err := h.GetFeatures(); err == nil || !isClosed(err) {
			t.Fatalf("second front-end got %v, want the connection closed", err)
		}
		exchange(t, g)
	})
}

// lineCounter is a slog handler that counts lines (and keeps the last
// few) without keeping them all.
type lineCounter struct {
	mu    sync.Mutex
	n     int
	bytes int
	tail  []string
}

// Enabled: the daemon's default level.
func (c *lineCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (c *lineCounter) WithAttrs([]slog.Attr) slog.Handler           { return c }
func (c *lineCounter) WithGroup(string) slog.Handler                { return c }
func (c *lineCounter) Handle(_ context.Context, r slog.Record) error {
	var b bytes.Buffer
	slog.NewTextHandler(&b, nil).Handle(context.Background(), r)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	c.bytes += b.Len()
	c.tail = append(c.tail, strings.TrimSpace(b.String()))
	if len(c.tail) > 5 {
		c.tail = c.tail[1:]
	}
	return nil
}

func (c *lineCounter) count() (int, int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.bytes, append([]string(nil), c.tail...)
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestEnableToggleFlood: every SET_VRING_ENABLE toggle restarts the pair
// and logged a "queue pair started" line: 10,000 toggles wrote 10,000+
// lines. Control-plane lines are rate-limited like guest-caused ones, and
// the toggles leave the heap where it was.
func TestEnableToggleFlood(t *testing.T) {
	for _, pl := range framePlanes {
		t.Run(pl.name, func(t *testing.T) {
			isolate(t, func(t *testing.T) {
				lines := &lineCounter{}
				s := startServerConfig(t, pl.make(t), func(_ *vhostuser.ServerConfig, d *vhostuser.DeviceConfig) {
					d.Logger = slog.New(lines)
				})
				f := s.connect(t, fe.Options{})
				f.Conn.Timeout = time.Minute // the server takes its time
				exchange(t, f)
				toggle := func(n int) {
					for i := 0; i < n; i++ {
						if err := f.Conn.Send(fe.ReqSetVringEnable, 0, state(uint32(i%2), uint32(i/2%2)), nil); err != nil {
							t.Fatal(err)
						}
					}
					if _, err := f.GetFeatures(); err != nil { // all handled
						t.Fatal(err)
					}
				}
				toggle(500)
				heap0 := heapInUse()
				n0, _, _ := lines.count()
				start := time.Now()
				toggle(10000)
				took := time.Since(start)
				n, size, tail := lines.count()
				heap1 := heapInUse()
				t.Logf("10,000 toggles in %v: %d log lines (%d bytes); heap in use %d → %d KiB",
					took.Round(time.Millisecond), n-n0, size, heap0>>10, heap1>>10)
				// A burst, then one line a second per message kind.
				if limit := 100 + 5*int(took.Seconds()); n-n0 > limit {
					t.Errorf("%d lines for 10,000 toggles (%v), want at most %d; last: %q", n-n0, took, limit, tail)
				}
				if heap1 > heap0+8<<20 {
					t.Errorf("heap in use grew from %d to %d KiB over 10,000 toggles", heap0>>10, heap1>>10)
				}
				if err := f.SetVringEnable(0, true); err != nil {
					t.Fatal(err)
				}
				if err := f.SetVringEnable(1, true); err != nil {
					t.Fatal(err)
				}
				exchange(t, f)
			})
		})
	}
}

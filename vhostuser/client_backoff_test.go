package vhostuser

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestConnectBackoffAfterShortSessions: a front-end that accepts, answers
// one exchange and drops the connection is redialled with a growing delay;
// only a session that lasted stableSession starts the backoff over.
func TestConnectBackoffAfterShortSessions(t *testing.T) {
	old := stableSession
	stableSession = 400 * time.Millisecond
	defer func() { stableSession = old }()
	for _, tc := range []struct {
		name    string
		hold    time.Duration // how long the front-end keeps each session
		minLast time.Duration // lower bound of the last redial gap
		maxLast time.Duration // upper bound of the last redial gap
	}{
		// Gaps 100, 200, 400ms: the third is the grown one.
		{name: "short sessions back off", hold: 0, minLast: 350 * time.Millisecond, maxLast: 2 * time.Second},
		// Each session lasts past stableSession: every redial after 100ms.
		{name: "stable sessions reset", hold: 450 * time.Millisecond, minLast: 50 * time.Millisecond, maxLast: 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "qemu.sock")
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() {
				done <- Connect(ctx, path, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t)})
			}()
			var ends, starts []time.Time
			for i := 0; i < 4; i++ {
				l.SetDeadline(time.Now().Add(10 * time.Second))
				c, err := l.AcceptUnix()
				if err != nil {
					t.Fatalf("accept %d: %v", i, err)
				}
				starts = append(starts, time.Now())
				fe := &frontend{t: t, c: c}
				fe.sync()
				time.Sleep(tc.hold)
				c.Close()
				ends = append(ends, time.Now())
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Connect: %v", err)
			}
			last := starts[3].Sub(ends[2])
			if last < tc.minLast || last > tc.maxLast {
				gaps := []time.Duration{starts[1].Sub(ends[0]), starts[2].Sub(ends[1]), last}
				t.Fatalf("redial gaps %v: last %v not in [%v, %v]", gaps, last, tc.minLast, tc.maxLast)
			}
		})
	}
}

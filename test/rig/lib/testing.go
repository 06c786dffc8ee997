package rig

import (
	"context"
	"testing"
)

// StartTB starts a rig for a test or benchmark: a start-up error fails tb
// at once, and tb.Cleanup tears the rig down (with the back-end's log tail
// in the test log when tb failed). Prerequisites (root, /dev/net/tun,
// iproute2, busybox) are the caller's to check.
func StartTB(tb testing.TB, opts Options) *Rig {
	tb.Helper()
	r, err := Start(context.Background(), opts)
	if err != nil {
		tb.Fatalf("start rig: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("rig %s ring state: %s", r.Name(), r.RingState())
			tb.Logf("back-end log tail (%s):\n%s", r.BackendLog(), tail(r.BackendLog(), 40))
		}
		if err := r.Close(); err != nil {
			tb.Errorf("close rig %s: %v", r.Name(), err)
		}
	})
	return r
}

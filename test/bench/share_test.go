package main

import (
	"math"
	"testing"

	rig "vunet/test/rig/lib"
)

// The back-end's share rows take the rig alone's cost beyond the kernel's
// out of each back-end row once (the rig alone crosses the rig once each
// way, as a back-end path does).
func TestBackendShares(t *testing.T) {
	ts := []*target{
		{backend: "kernel"},
		// The functions only test rig against nil: a zero Rig will do.
		{backend: aloneName, alone: true, rig: &rig.Rig{}},
		{backend: "vunet", rig: &rig.Rig{}},
	}

	rr := backendShare(map[string]float64{"kernel": 12, aloneName: 30, "vunet": 54}, ts, 65520)
	if len(rr) != 1 || rr[0].Backend != "vunet" || rr[0].Value != 36 {
		t.Fatalf("RR share rows %+v, want one vunet row of 54 − (30 − 12) = 36", rr)
	}
	// 1e6/10000 = 100 µs per kernel connection, 1e6/5000 = 200 through the
	// rig alone: the rig's share is 100 µs; vunet's 250 µs less 100 is
	// 150 µs, 6,667 conn/s.
	cr := backendRateShare(map[string]float64{"kernel": 10000, aloneName: 5000, "vunet": 4000}, ts, 65520)
	if len(cr) != 1 || cr[0].Backend != "vunet" || math.Abs(cr[0].Value-1e6/150) > 1e-6 {
		t.Fatalf("connection-rate share rows %+v, want one vunet row of %.1f", cr, 1e6/150)
	}
	// A rig alone slower than the whole path: no value, a note says why.
	cr = backendRateShare(map[string]float64{"kernel": 10000, aloneName: 2000, "vunet": 4000}, ts, 65520)
	if len(cr) != 1 || cr[0].Value != 0 || cr[0].Note == "" {
		t.Fatalf("connection-rate share rows %+v, want a vunet row without a value", cr)
	}
}

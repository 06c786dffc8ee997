package vhostuser

import (
	"errors"
	"testing"

	"vunet/virtqueue"
)

// TestRingAtRegionEnd: a ring part ending exactly at the end of guest
// memory is legal without EVENT_IDX (no trailing event field), and one byte
// pair short with it; SET_VRING_ADDR must agree with the queue it builds.
func TestRingAtRegionEnd(t *testing.T) {
	const n = testRingSize
	for _, tc := range []struct {
		name     string
		eventIdx bool
		part     string // which part ends at the region end
		wantErr  bool
	}{
		{name: "used/no-event-idx", part: "used"},
		{name: "avail/no-event-idx", part: "avail"},
		{name: "used/event-idx", part: "used", eventIdx: true, wantErr: true},
		{name: "avail/event-idx", part: "avail", eventIdx: true, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuestMem(t, testGPA, testUA, testSize)
			h := newHarness(t, 1)
			defer h.d.close()
			features := DefaultFeatures
			if !tc.eventIdx {
				features &^= 1 << virtqueue.FeatureRingEventIdx
			}
			h.ok(ReqSetFeatures, u64(features))
			h.ok(ReqSetProtocolFeatures, u64(OfferedProtocolFeatures))
			h.ok(ReqAddMemReg, memReg(g.spec), g.dupFD(t))
			a := g.ringAddr(1)
			end := uint64(testUA + testSize)
			switch tc.part {
			case "used":
				a.Used = end - (4 + 8*n)
			case "avail":
				a.Avail = end - (4 + 2*n)
			}
			h.ok(ReqSetVringNum, state(1, n))
			_, _, err := h.do(ReqSetVringAddr, 0, addr(a))
			if tc.wantErr {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("SET_VRING_ADDR: %v, want ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("SET_VRING_ADDR: %v", err)
			}
			h.ok(ReqSetVringNum, state(0, n))
			h.ok(ReqSetVringAddr, addr(g.ringAddr(0)))
			for i := 0; i < 2; i++ {
				h.ok(ReqSetVringKick, u64(uint64(i)), eventfd(t))
			}
			if !h.d.running[0] {
				t.Fatalf("pair with a ring at the region end not running")
			}
		})
	}
}

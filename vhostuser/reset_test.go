package vhostuser

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

// TestResetOwnerAndResetDevice: RESET_OWNER (deprecated) only stops and
// disables the rings, keeping descriptors, addresses, features and the data
// plane's session, as the spec recommends; RESET_DEVICE is a full reset:
// rings forgotten, features, protocol features and status cleared, session
// ended. Memory stays for both.
func TestResetOwnerAndResetDevice(t *testing.T) {
	for _, tc := range []struct {
		req        Request
		wantEvents string
		keepsRings bool
	}{
		{req: ReqResetOwner, wantEvents: "stop 0", keepsRings: true},
		{req: ReqResetDevice, wantEvents: "stop 0,end", keepsRings: false},
	} {
		t.Run(tc.req.String(), func(t *testing.T) {
			g := newGuestMem(t, testGPA, testUA, testSize)
			h := newHarness(t, 1)
			defer h.d.close()
			h.negotiate(OfferedProtocolFeatures)
			h.setupPair(g, 0, true)
			h.ok(ReqSetStatus, u64(0xf))
			if !h.d.running[0] {
				t.Fatalf("pair not running")
			}
			h.dp.takeEvents()
			kick, call := h.d.rings[1].kick, h.d.rings[1].call
			// Sent with NEED_REPLY under REPLY_ACK: acked even though
			// RESET_DEVICE forgets the protocol features.
			if r, send, err := h.do(tc.req, FlagNeedReply, nil); err != nil || !send || !bytes.Equal(r, u64(0)) {
				t.Fatalf("%v: reply %x send %v err %v", tc.req, r, send, err)
			}
			if ev := h.dp.takeEvents(); ev != tc.wantEvents {
				t.Fatalf("events %q, want %q", ev, tc.wantEvents)
			}
			if h.d.running[0] || len(h.d.slots) != 1 {
				t.Fatalf("running %v slots %d", h.d.running[0], len(h.d.slots))
			}
			r := &h.d.rings[1]
			if r.started || r.enabled {
				t.Fatalf("ring 1 started %v enabled %v after reset", r.started, r.enabled)
			}
			if tc.keepsRings {
				if r.kick != kick || r.call != call || r.num != testRingSize || !r.addrSet {
					t.Fatalf("ring 1 lost its state: %+v", *r)
				}
				if _, err := unix.FcntlInt(uintptr(kick), unix.F_GETFD, 0); err != nil {
					t.Fatalf("kick fd closed: %v", err)
				}
				if h.d.features != DefaultFeatures || h.d.protocol != OfferedProtocolFeatures ||
					h.stats.Features.Load() != DefaultFeatures || h.d.status != 0xf {
					t.Fatalf("features %#x protocol %#x status %#x", h.d.features, h.d.protocol, h.d.status)
				}
				// Kicks and enables bring the pair back where it stopped.
				for i := 0; i < 2; i++ {
					h.ok(ReqSetVringKick, u64(uint64(i)), eventfd(t))
					h.ok(ReqSetVringEnable, state(uint32(i), 1))
				}
				if !h.d.running[0] {
					t.Fatalf("pair not restarted after RESET_OWNER")
				}
				return
			}
			if r.kick != -1 || r.call != -1 || r.num != 0 || r.addrSet {
				t.Fatalf("ring 1 not forgotten: %+v", *r)
			}
			if h.d.features != 0 || h.d.protocol != 0 || h.stats.Features.Load() != 0 ||
				h.stats.ProtocolFeatures.Load() != 0 || h.d.status != 0 {
				t.Fatalf("features %#x protocol %#x stats %#x/%#x status %#x", h.d.features, h.d.protocol,
					h.stats.Features.Load(), h.stats.ProtocolFeatures.Load(), h.d.status)
			}
		})
	}
}

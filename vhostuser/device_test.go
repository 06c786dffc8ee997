package vhostuser

import (
	"bytes"
	"errors"
	"fmt"
	"runtime/debug"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

// harness drives a device directly (no socket), as the session loop does.
type harness struct {
	t     *testing.T
	d     *device
	dp    *fakeDP
	stats *Stats
}

func newHarness(t *testing.T, pairs int) *harness {
	dp := newFakeDP()
	st := &Stats{}
	d := newDevice(DeviceConfig{QueuePairs: pairs, DataPlane: dp, Logger: testLogger(t), Stats: st})
	return &harness{t: t, d: d, dp: dp, stats: st}
}

// do processes one request; fds are handed over to the device.
func (h *harness) do(req Request, flags uint32, payload []byte, fds ...int) (reply []byte, send bool, err error) {
	m := Message{
		Header:  Header{Request: req, Flags: FlagVersion1 | flags, Size: uint32(len(payload))},
		Payload: payload,
		FDs:     append([]int(nil), fds...),
	}
	reply, send, err = h.d.process(&m)
	return append([]byte(nil), reply...), send, err
}

// ok processes a request that must succeed without a reply.
func (h *harness) ok(req Request, payload []byte, fds ...int) {
	h.t.Helper()
	if r, send, err := h.do(req, 0, payload, fds...); err != nil || send {
		h.t.Fatalf("%v: send=%v reply=%x err=%v", req, send, r, err)
	}
}

// negotiate acknowledges the default features and the given protocol
// features, as QEMU does first.
func (h *harness) negotiate(proto uint64) {
	h.t.Helper()
	h.ok(ReqSetFeatures, u64(DefaultFeatures))
	h.ok(ReqSetProtocolFeatures, u64(proto))
}

// setupPair gives pair p memory (once), sizes, bases, addresses, call fds
// and kick fds; it returns the call eventfds (test keeps a dup).
func (h *harness) setupPair(g *guestMem, p int, enable bool) {
	h.t.Helper()
	if len(h.d.slots) == 0 {
		h.ok(ReqAddMemReg, memReg(g.spec), g.dupFD(h.t))
	}
	for i := 2 * p; i <= 2*p+1; i++ {
		h.ok(ReqSetVringNum, state(uint32(i), testRingSize))
		h.ok(ReqSetVringBase, state(uint32(i), 0))
		h.ok(ReqSetVringAddr, addr(g.ringAddr(i)))
		h.ok(ReqSetVringKick, u64(uint64(i)), eventfd(h.t))
		h.ok(ReqSetVringCall, u64(uint64(i)), eventfd(h.t))
		if enable {
			h.ok(ReqSetVringEnable, state(uint32(i), 1))
		}
	}
}

func TestFeatureNegotiation(t *testing.T) {
	h := newHarness(t, 1)
	defer h.d.close()
	r, send, err := h.do(ReqGetFeatures, 0, nil)
	if err != nil || !send || !bytes.Equal(r, u64(DefaultFeatures)) {
		t.Fatalf("GET_FEATURES = %x %v %v", r, send, err)
	}
	want := uint64(1<<virtqueue.FeatureVersion1 | 1<<virtqueue.FeatureNetMrgRxbuf | 1<<virtqueue.FeatureRingEventIdx |
		1<<virtqueue.FeatureRingIndirectDesc | 1<<virtqueue.FeatureNetMTU | 1<<30 |
		1<<26 | // VHOST_F_LOG_ALL: migration
		// checksum and TSO offloads, both directions
		1<<0 | 1<<1 | 1<<7 | 1<<8 | 1<<11 | 1<<12 |
		// USO: GUEST_USO4, GUEST_USO6, HOST_USO
		1<<54 | 1<<55 | 1<<56)
	if DefaultFeatures != want {
		t.Fatalf("DefaultFeatures = %#x, want %#x", DefaultFeatures, want)
	}
	// Protocol features work before SET_FEATURES (spec note).
	r, _, _ = h.do(ReqGetProtocolFeatures, 0, nil)
	wantProto := uint64(1<<3 | 1<<0 | 1<<15 | 1<<4 | 1<<2 | 1<<16 | 1<<13 | 1<<1 | 1<<19)
	if !bytes.Equal(r, u64(wantProto)) {
		t.Fatalf("GET_PROTOCOL_FEATURES = %x, want %#x", r, wantProto)
	}
	// A subset is fine; an unoffered bit is refused and changes nothing.
	h.ok(ReqSetFeatures, u64(1<<virtqueue.FeatureVersion1|FeatureProtocolFeatures))
	if _, _, err := h.do(ReqSetFeatures, 0, u64(1<<virtqueue.FeatureVersion1|1<<virtqueue.FeatureRingPacked)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("RING_PACKED accepted: %v", err)
	}
	if h.d.features != 1<<virtqueue.FeatureVersion1|FeatureProtocolFeatures || h.stats.Features.Load() != h.d.features {
		t.Fatalf("features %#x stats %#x", h.d.features, h.stats.Features.Load())
	}
	if _, _, err := h.do(ReqSetProtocolFeatures, 0, u64(ProtocolInflightSHMFD)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("INFLIGHT_SHMFD accepted: %v", err)
	}
	h.ok(ReqSetProtocolFeatures, u64(ProtocolReplyAck|ProtocolMQ))
	if h.stats.ProtocolFeatures.Load() != ProtocolReplyAck|ProtocolMQ {
		t.Fatalf("protocol stats %#x", h.stats.ProtocolFeatures.Load())
	}
	if h.stats.ErrorCount(ErrReasonInvalid) != 2 || h.stats.MessageCount(ReqSetFeatures) != 2 {
		t.Fatalf("errors %d set_features %d", h.stats.ErrorCount(ErrReasonInvalid), h.stats.MessageCount(ReqSetFeatures))
	}
	h.d.close()
	if h.stats.Features.Load() != 0 || h.stats.ProtocolFeatures.Load() != 0 {
		t.Fatalf("negotiated features survive disconnect")
	}
}

func TestFeaturesWithoutProtocolFeatures(t *testing.T) {
	dp := newFakeDP()
	d := newDevice(DeviceConfig{DataPlane: dp, Logger: testLogger(t), Features: 1 << virtqueue.FeatureVersion1})
	defer d.close()
	h := &harness{t: t, d: d, dp: dp, stats: d.stats}
	if _, _, err := h.do(ReqGetProtocolFeatures, 0, nil); err == nil {
		t.Fatalf("GET_PROTOCOL_FEATURES allowed without PROTOCOL_FEATURES offered")
	}
	// Without PROTOCOL_FEATURES rings run enabled without SET_VRING_ENABLE.
	g := newGuestMem(t, testGPA, testUA, testSize)
	h.ok(ReqSetFeatures, u64(1<<virtqueue.FeatureVersion1))
	h.setupPair(g, 0, false)
	qp, ok := dp.pair(0)
	if !ok || !qp.RXEnabled || !qp.TXEnabled || qp.Features != 1<<virtqueue.FeatureVersion1 {
		t.Fatalf("pair = %+v running=%v", qp, ok)
	}
}

// msgCase is one request in the per-message table: a valid and a malformed
// form.
type msgCase struct {
	name      string
	req       Request
	setup     func(h *harness, g *guestMem)
	payload   func(g *guestMem) []byte
	fds       func(h *harness, g *guestMem) []int
	wantReply []byte // nil: no reply of its own
	check     func(t *testing.T, h *harness)
	bad       []byte // malformed payload
	badFDs    func(h *harness, g *guestMem) []int
	badReason ErrorReason
}

func constPayload(b []byte) func(*guestMem) []byte { return func(*guestMem) []byte { return b } }
func oneEventfd(h *harness, _ *guestMem) []int     { return []int{eventfd(h.t)} }
func memFD(h *harness, g *guestMem) []int          { return []int{g.dupFD(h.t)} }
func addMem(h *harness, g *guestMem)               { h.ok(ReqAddMemReg, memReg(g.spec), g.dupFD(h.t)) }

func messageCases() []msgCase {
	return []msgCase{
		{name: "GET_FEATURES", req: ReqGetFeatures, payload: constPayload(nil), wantReply: u64(DefaultFeatures | 1<<virtqueue.FeatureNetMQ),
			bad: u64(0), badReason: ErrReasonMalformed},
		{name: "SET_FEATURES", req: ReqSetFeatures, payload: constPayload(u64(DefaultFeatures)),
			check: func(t *testing.T, h *harness) {
				if h.d.features != DefaultFeatures {
					t.Errorf("features %#x", h.d.features)
				}
			},
			bad: []byte{1, 2, 3, 4}, badReason: ErrReasonMalformed},
		{name: "SET_OWNER", req: ReqSetOwner, payload: constPayload(nil),
			check: func(t *testing.T, h *harness) {
				if !h.d.owned {
					t.Errorf("not owned")
				}
			},
			bad: []byte{0}, badReason: ErrReasonMalformed},
		{name: "RESET_OWNER", req: ReqResetOwner, payload: constPayload(nil),
			bad: u64(1), badReason: ErrReasonMalformed},
		{name: "GET_PROTOCOL_FEATURES", req: ReqGetProtocolFeatures, payload: constPayload(nil),
			wantReply: u64(OfferedProtocolFeatures), bad: []byte{1}, badReason: ErrReasonMalformed},
		{name: "SET_PROTOCOL_FEATURES", req: ReqSetProtocolFeatures, payload: constPayload(u64(OfferedProtocolFeatures)),
			check: func(t *testing.T, h *harness) {
				if h.d.protocol != OfferedProtocolFeatures {
					t.Errorf("protocol %#x", h.d.protocol)
				}
			},
			bad: u64(ProtocolPagefault), badReason: ErrReasonInvalid},
		{name: "GET_QUEUE_NUM", req: ReqGetQueueNum, payload: constPayload(nil), wantReply: u64(2),
			bad: u64(2), badReason: ErrReasonMalformed},
		{name: "SET_MEM_TABLE", req: ReqSetMemTable, payload: func(g *guestMem) []byte { return table(g.spec) }, fds: memFD,
			check: func(t *testing.T, h *harness) {
				if len(h.d.slots) != 1 || len(h.d.mem.Regions()) != 1 {
					t.Errorf("slots %d", len(h.d.slots))
				}
			},
			bad: func() []byte { b := table(); b[0] = 9; return b }(), badReason: ErrReasonMalformed},
		{name: "SET_MEM_TABLE/fd-count", req: ReqSetMemTable, payload: func(g *guestMem) []byte { return table(g.spec) }, fds: memFD,
			bad: table(MemRegion{Size: 4096}), badFDs: func(*harness, *guestMem) []int { return nil }, badReason: ErrReasonMalformed},
		{name: "SET_MEM_TABLE/overlap", req: ReqSetMemTable, payload: func(g *guestMem) []byte { return table(g.spec) }, fds: memFD,
			bad:    table(MemRegion{Size: 4096}, MemRegion{GuestAddr: 2048, UserAddr: 1 << 40, Size: 4096}),
			badFDs: func(h *harness, g *guestMem) []int { return []int{g.dupFD(h.t), g.dupFD(h.t)} }, badReason: ErrReasonMemory},
		{name: "GET_MAX_MEM_SLOTS", req: ReqGetMaxMemSlots, payload: constPayload(nil), wantReply: u64(MaxMemSlots),
			bad: make([]byte, 16), badReason: ErrReasonMalformed},
		{name: "ADD_MEM_REG", req: ReqAddMemReg, payload: func(g *guestMem) []byte { return memReg(g.spec) }, fds: memFD,
			check: func(t *testing.T, h *harness) {
				if len(h.d.slots) != 1 || h.d.slots[0].refs != 1 {
					t.Errorf("slots %+v", h.d.slots)
				}
			},
			bad: make([]byte, 39), badFDs: memFD, badReason: ErrReasonMalformed},
		{name: "ADD_MEM_REG/no-fd", req: ReqAddMemReg, payload: func(g *guestMem) []byte { return memReg(g.spec) }, fds: memFD,
			bad: memReg(MemRegion{Size: 4096}), badFDs: func(*harness, *guestMem) []int { return nil }, badReason: ErrReasonMalformed},
		{name: "ADD_MEM_REG/size-0", req: ReqAddMemReg, payload: func(g *guestMem) []byte { return memReg(g.spec) }, fds: memFD,
			bad: memReg(MemRegion{}), badFDs: memFD, badReason: ErrReasonMemory},
		{name: "REM_MEM_REG", req: ReqRemMemReg, setup: addMem, payload: func(g *guestMem) []byte { return memReg(g.spec) },
			check: func(t *testing.T, h *harness) {
				if len(h.d.slots) != 0 {
					t.Errorf("slots %d after remove", len(h.d.slots))
				}
			},
			bad: memReg(MemRegion{GuestAddr: 1 << 30, Size: 4096}), badReason: ErrReasonInvalid},
		{name: "REM_MEM_REG/stray-fd", req: ReqRemMemReg, setup: addMem, payload: func(g *guestMem) []byte { return memReg(g.spec) },
			fds: oneEventfd, bad: memReg(MemRegion{}), badFDs: func(h *harness, _ *guestMem) []int { return []int{eventfd(h.t), eventfd(h.t)} },
			badReason: ErrReasonMalformed},
		{name: "SET_VRING_NUM", req: ReqSetVringNum, payload: constPayload(state(3, 256)),
			check: func(t *testing.T, h *harness) {
				if h.d.rings[3].num != 256 {
					t.Errorf("num %d", h.d.rings[3].num)
				}
			},
			bad: state(0, 100), badReason: ErrReasonInvalid},
		{name: "SET_VRING_NUM/max", req: ReqSetVringNum, payload: constPayload(state(0, 32768)),
			bad: state(0, 65536), badReason: ErrReasonInvalid},
		{name: "SET_VRING_NUM/index", req: ReqSetVringNum, payload: constPayload(state(0, 1)),
			bad: state(4, 256), badReason: ErrReasonInvalid},
		{name: "SET_VRING_ADDR", req: ReqSetVringAddr, setup: addMem, payload: func(g *guestMem) []byte { return addr(g.ringAddr(1)) },
			check: func(t *testing.T, h *harness) {
				r := h.d.rings[1]
				d, a, u := vqtest.RingLayout(testRingSize, ringGPA(1))
				if !r.addrSet || r.addr.Desc != testUA+d || r.addr.Avail != testUA+a || r.addr.Used != testUA+u {
					t.Errorf("ring %+v", r)
				}
			},
			bad: addr(VringAddr{Index: 1, Desc: testUA + testSize, Avail: testUA, Used: testUA}), badReason: ErrReasonInvalid},
		{name: "SET_VRING_ADDR/misaligned", req: ReqSetVringAddr, setup: addMem, payload: func(g *guestMem) []byte { return addr(g.ringAddr(0)) },
			bad: addr(VringAddr{Desc: testUA + 8, Avail: testUA + 0x1000, Used: testUA + 0x2000}), badReason: ErrReasonInvalid},
		{name: "SET_VRING_ADDR/size", req: ReqSetVringAddr, setup: addMem, payload: func(g *guestMem) []byte { return addr(g.ringAddr(0)) },
			bad: make([]byte, 41), badReason: ErrReasonMalformed},
		{name: "SET_VRING_BASE", req: ReqSetVringBase, payload: constPayload(state(1, 7)),
			check: func(t *testing.T, h *harness) {
				if h.d.rings[1].base != 7 {
					t.Errorf("base %d", h.d.rings[1].base)
				}
			},
			bad: state(1, 0x10000), badReason: ErrReasonInvalid},
		{name: "GET_VRING_BASE", req: ReqGetVringBase,
			setup:   func(h *harness, _ *guestMem) { h.ok(ReqSetVringBase, state(2, 42)) },
			payload: constPayload(state(2, 0)), wantReply: state(2, 42),
			bad: state(9, 0), badReason: ErrReasonInvalid},
		{name: "SET_VRING_KICK", req: ReqSetVringKick, payload: constPayload(u64(1)), fds: oneEventfd,
			check: func(t *testing.T, h *harness) {
				if r := h.d.rings[1]; !r.started || r.kick < 0 {
					t.Errorf("ring %+v", r)
				}
			},
			bad: u64(1), badFDs: func(*harness, *guestMem) []int { return nil }, badReason: ErrReasonMalformed},
		{name: "SET_VRING_KICK/polling", req: ReqSetVringKick, payload: constPayload(u64(1 | VringNoFDFlag)),
			check: func(t *testing.T, h *harness) {
				if r := h.d.rings[1]; !r.started || r.kick != -1 {
					t.Errorf("ring %+v", r)
				}
			},
			bad: u64(1 | VringNoFDFlag), badFDs: oneEventfd, badReason: ErrReasonMalformed},
		{name: "SET_VRING_CALL", req: ReqSetVringCall, payload: constPayload(u64(0)), fds: oneEventfd,
			check: func(t *testing.T, h *harness) {
				if r := h.d.rings[0]; r.call < 0 || !r.freshCall {
					t.Errorf("ring %+v", r)
				}
			},
			bad: u64(0x200), badReason: ErrReasonInvalid},
		{name: "SET_VRING_CALL/index", req: ReqSetVringCall, payload: constPayload(u64(3)), fds: oneEventfd,
			bad: u64(4), badFDs: oneEventfd, badReason: ErrReasonInvalid},
		{name: "SET_VRING_ERR", req: ReqSetVringErr, payload: constPayload(u64(2)), fds: oneEventfd,
			check: func(t *testing.T, h *harness) {
				if h.d.rings[2].errFD < 0 {
					t.Errorf("err fd not kept")
				}
			},
			bad: []byte{2, 0, 0, 0}, badFDs: oneEventfd, badReason: ErrReasonMalformed},
		{name: "SET_VRING_ENABLE", req: ReqSetVringEnable, payload: constPayload(state(1, 1)),
			check: func(t *testing.T, h *harness) {
				if !h.d.rings[1].enabled {
					t.Errorf("not enabled")
				}
			},
			bad: state(1, 2), badReason: ErrReasonInvalid},
		{name: "SEND_RARP", req: ReqSendRARP, payload: constPayload([]byte{0x52, 0x54, 0, 0x12, 0x34, 0x56, 0, 0}),
			check: func(t *testing.T, h *harness) {
				if len(h.dp.announce) != 1 || h.dp.announce[0] != [6]byte{0x52, 0x54, 0, 0x12, 0x34, 0x56} {
					t.Errorf("announced %x", h.dp.announce)
				}
			},
			bad: []byte{0x52, 0x54, 0, 0x12, 0x34, 0x56}, badReason: ErrReasonMalformed},
		{name: "NET_SET_MTU", req: ReqNetSetMTU, payload: constPayload(u64(9000)),
			check: func(t *testing.T, h *harness) {
				if len(h.dp.mtus) != 1 || h.dp.mtus[0] != 9000 || h.d.mtu != 9000 {
					t.Errorf("mtus %v", h.dp.mtus)
				}
			},
			bad: u64(67), badReason: ErrReasonInvalid},
		{name: "SET_STATUS", req: ReqSetStatus, payload: constPayload(u64(0xf)),
			check: func(t *testing.T, h *harness) {
				if h.d.status != 0xf {
					t.Errorf("status %#x", h.d.status)
				}
			},
			bad: u64(0x100), badReason: ErrReasonInvalid},
		{name: "GET_STATUS", req: ReqGetStatus, setup: func(h *harness, _ *guestMem) { h.ok(ReqSetStatus, u64(7)) },
			payload: constPayload(nil), wantReply: u64(7), bad: u64(0), badReason: ErrReasonMalformed},
		{name: "RESET_DEVICE", req: ReqResetDevice,
			setup:   func(h *harness, _ *guestMem) { h.ok(ReqSetVringNum, state(0, 64)) },
			payload: constPayload(nil),
			check: func(t *testing.T, h *harness) {
				if h.d.rings[0].num != 0 {
					t.Errorf("ring not reset")
				}
			},
			bad: []byte{1, 2}, badReason: ErrReasonMalformed},
	}
}

// TestMessages runs every request valid and malformed, without and with
// REPLY_ACK, checking replies, state, counters, and that no descriptor
// leaks.
func TestMessages(t *testing.T) {
	g := newGuestMem(t, testGPA, testUA, testSize)
	baseline := openFDs(t)
	for _, tc := range messageCases() {
		for _, ack := range []bool{false, true} {
			name := tc.name
			if ack {
				name += "/reply-ack"
			}
			t.Run(name+"/valid", func(t *testing.T) {
				h := newHarness(t, 2)
				if ack {
					h.ok(ReqSetProtocolFeatures, u64(ProtocolReplyAck))
				}
				if tc.setup != nil {
					tc.setup(h, g)
				}
				var fds []int
				if tc.fds != nil {
					fds = tc.fds(h, g)
				}
				flags := uint32(0)
				if ack {
					flags = FlagNeedReply
				}
				before := h.stats.MessageCount(tc.req)
				reply, send, err := h.do(tc.req, flags, tc.payload(g), fds...)
				if err != nil {
					t.Fatalf("error: %v", err)
				}
				switch {
				case tc.wantReply != nil:
					if !send || !bytes.Equal(reply, tc.wantReply) {
						t.Fatalf("reply %x send=%v, want %x", reply, send, tc.wantReply)
					}
				case ack:
					if !send || !bytes.Equal(reply, u64(0)) {
						t.Fatalf("ack %x send=%v, want 0", reply, send)
					}
				case send:
					t.Fatalf("unexpected reply %x", reply)
				}
				if tc.check != nil {
					tc.check(t, h)
				}
				if h.stats.MessageCount(tc.req) != before+1 {
					t.Fatalf("message count %d", h.stats.MessageCount(tc.req))
				}
				for r := ErrorReason(0); r < NumErrorReasons; r++ {
					if n := h.stats.ErrorCount(r); n != 0 {
						t.Fatalf("error %v counted %d", r, n)
					}
				}
				h.d.close()
			})
			t.Run(name+"/malformed", func(t *testing.T) {
				h := newHarness(t, 2)
				if ack {
					h.ok(ReqSetProtocolFeatures, u64(ProtocolReplyAck))
				}
				if tc.setup != nil {
					tc.setup(h, g)
				}
				var fds []int
				switch {
				case tc.badFDs != nil:
					fds = tc.badFDs(h, g)
				case tc.fds != nil:
					fds = tc.fds(h, g)
				}
				flags := uint32(0)
				if ack {
					flags = FlagNeedReply
				}
				reply, send, err := h.do(tc.req, flags, tc.bad, fds...)
				if ack && !hasOwnReply(tc.req) {
					if err != nil || !send || bytes.Equal(reply, u64(0)) || len(reply) != 8 {
						t.Fatalf("want failure ack, got %x send=%v err=%v", reply, send, err)
					}
				} else if err == nil || send {
					t.Fatalf("want connection closed, got reply %x send=%v err=%v", reply, send, err)
				}
				if n := h.stats.ErrorCount(tc.badReason); n != 1 {
					t.Fatalf("error reason %v counted %d", tc.badReason, n)
				}
				h.d.close()
			})
		}
	}
	if n := openFDs(t); n > baseline {
		t.Fatalf("descriptor leak: %d open, %d before", n, baseline)
	}
}

func TestUnknownRequest(t *testing.T) {
	h := newHarness(t, 1)
	defer h.d.close()
	// Without NEED_REPLY: logged and ignored; fds closed.
	before := openFDs(t)
	if r, send, err := h.do(Request(99), 0, []byte("whatever"), eventfd(t)); err != nil || send {
		t.Fatalf("unknown: %x %v %v", r, send, err)
	}
	if n := openFDs(t); n > before {
		t.Fatalf("fd of unknown request kept: %d vs %d", n, before)
	}
	// With NEED_REPLY, even without REPLY_ACK: a failure reply, so the
	// front-end does not wait forever.
	if r, send, err := h.do(ReqSetVringEndian, FlagNeedReply, make([]byte, 8)); err != nil || !send || !bytes.Equal(r, u64(1)) {
		t.Fatalf("unsupported with NEED_REPLY: %x %v %v", r, send, err)
	}
	if h.stats.ErrorCount(ErrReasonUnsupported) != 2 || h.stats.MessageCount(Request(99)) != 1 || h.stats.MessageCount(ReqNone) != 1 {
		t.Fatalf("unsupported=%d unknown=%d", h.stats.ErrorCount(ErrReasonUnsupported), h.stats.MessageCount(ReqNone))
	}
}

func TestReplyAck(t *testing.T) {
	h := newHarness(t, 1)
	defer h.d.close()
	// NEED_REPLY before REPLY_ACK is negotiated: no ack (QEMU only sets it
	// after negotiating).
	if _, send, err := h.do(ReqSetOwner, FlagNeedReply, nil); err != nil || send {
		t.Fatalf("acked without REPLY_ACK: %v %v", send, err)
	}
	h.ok(ReqSetProtocolFeatures, u64(ProtocolReplyAck))
	// No NEED_REPLY: no ack even with REPLY_ACK.
	if _, send, _ := h.do(ReqSetStatus, 0, u64(1)); send {
		t.Fatalf("acked without NEED_REPLY")
	}
	if r, send, _ := h.do(ReqSetStatus, FlagNeedReply, u64(1)); !send || !bytes.Equal(r, u64(0)) {
		t.Fatalf("ack = %x %v", r, send)
	}
	if r, send, _ := h.do(ReqSetStatus, FlagNeedReply, u64(1000)); !send || !bytes.Equal(r, u64(1)) {
		t.Fatalf("failure ack = %x %v", r, send)
	}
	// A request with its own reply answers with it, not an ack.
	if r, _, _ := h.do(ReqGetQueueNum, FlagNeedReply, nil); !bytes.Equal(r, u64(1)) {
		t.Fatalf("GET_QUEUE_NUM with NEED_REPLY = %x", r)
	}
}

// TestPairLifecycle follows QEMU's order and checks when the data plane
// starts and stops pairs, with which enable state, and that a new call fd
// is signalled once.
func TestPairLifecycle(t *testing.T) {
	g := newGuestMem(t, testGPA, testUA, testSize)
	h := newHarness(t, 2)
	defer h.d.close()
	h.negotiate(OfferedProtocolFeatures)
	h.ok(ReqAddMemReg, memReg(g.spec), g.dupFD(t))
	for i := 0; i < 2; i++ {
		h.ok(ReqSetVringNum, state(uint32(i), testRingSize))
		h.ok(ReqSetVringBase, state(uint32(i), 0))
		h.ok(ReqSetVringAddr, addr(g.ringAddr(i)))
		h.ok(ReqSetVringKick, u64(uint64(i)), eventfd(t))
	}
	if ev := h.dp.takeEvents(); ev != "start 0" {
		t.Fatalf("events %q", ev)
	}
	qp, _ := h.dp.pair(0)
	if qp.RXEnabled || qp.TXEnabled || qp.Features != DefaultFeatures || qp.RX.Size() != testRingSize {
		t.Fatalf("pair before enable %+v", qp)
	}
	// A new call fd restarts the pair and is signalled once.
	call := eventfd(t)
	defer closeFD(call)
	h.ok(ReqSetVringCall, u64(0), dupFD(t, call))
	if ev := h.dp.takeEvents(); ev != "stop 0,start 0" {
		t.Fatalf("events %q", ev)
	}
	if v := readEventfd(t, call); v != 1 {
		t.Fatalf("call fd signalled %d times", v)
	}
	h.ok(ReqSetVringEnable, state(0, 1))
	h.ok(ReqSetVringEnable, state(1, 1))
	h.ok(ReqSetVringEnable, state(1, 1)) // no change: no restart
	if ev := h.dp.takeEvents(); ev != "stop 0,start 0,stop 0,start 0" {
		t.Fatalf("events %q", ev)
	}
	if qp, _ := h.dp.pair(0); !qp.RXEnabled || !qp.TXEnabled {
		t.Fatalf("pair not enabled: %+v", qp)
	}
	if v := readEventfd(t, call); v != 0 {
		t.Fatalf("call fd signalled again on restart: %d", v)
	}
	// Pair 1 has no rings set up; ring index 4 does not exist.
	if _, _, err := h.do(ReqSetVringKick, 0, u64(4), eventfd(t)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ring 4 accepted: %v", err)
	}
	// GET_VRING_BASE stops the pair; a new kick starts it again.
	h.do(ReqGetVringBase, 0, state(0, 0))
	if ev := h.dp.takeEvents(); ev != "stop 0" {
		t.Fatalf("events %q", ev)
	}
	if h.d.rings[0].started || h.d.rings[0].kick != -1 {
		t.Fatalf("ring 0 still started")
	}
	h.ok(ReqSetVringKick, u64(0), eventfd(t))
	if ev := h.dp.takeEvents(); ev != "start 0" {
		t.Fatalf("events %q", ev)
	}
	// StartPair failing is reported (data plane reason) and the pair stays
	// stopped.
	h.dp.failNext = true
	if _, _, err := h.do(ReqSetVringNum, 0, state(1, testRingSize)); err == nil {
		t.Fatalf("failed StartPair not reported")
	}
	if h.d.running[0] || h.stats.ErrorCount(ErrReasonDataPlane) != 1 {
		t.Fatalf("running=%v data-plane errors=%d", h.d.running[0], h.stats.ErrorCount(ErrReasonDataPlane))
	}
	// RESET_DEVICE stops everything, forgets the rings and ends the guest's
	// session in the data plane (its flows are meaningless now).
	h.ok(ReqSetVringNum, state(1, testRingSize))
	h.dp.takeEvents()
	h.ok(ReqResetDevice, nil)
	if ev := h.dp.takeEvents(); ev != "stop 0,end" || h.d.rings[1].num != 0 || h.d.rings[1].kick != -1 {
		t.Fatalf("after reset: events %q ring %+v", ev, h.d.rings[1])
	}
}

// TestGetVringBaseAfterPops checks that GET_VRING_BASE returns how far the
// data plane consumed, and that a rebuild continues from there.
func TestGetVringBaseAfterPops(t *testing.T) {
	g := newGuestMem(t, testGPA, testUA, testSize)
	h := newHarness(t, 1)
	defer h.d.close()
	h.dp.onStart = drainPopper
	h.negotiate(OfferedProtocolFeatures)
	g.offer(1, 3, false) // three TX frames
	g.offer(0, 2, true)  // two RX buffers
	h.setupPair(g, 0, true)
	if g.usedIdx(1) != 3 || g.usedIdx(0) != 2 {
		t.Fatalf("used idx tx=%d rx=%d", g.usedIdx(1), g.usedIdx(0))
	}
	if n := h.stats.Rings[1].Chains.Load(); n != 3 {
		t.Fatalf("ring 1 chains %d", n)
	}
	// More frames while running; the next restart (new call fd) pops them.
	g.offer(1, 2, false)
	h.ok(ReqSetVringCall, u64(1), eventfd(t))
	r, _, err := h.do(ReqGetVringBase, 0, state(1, 0))
	if err != nil || !bytes.Equal(r, state(1, 5)) {
		t.Fatalf("GET_VRING_BASE(1) = %x %v, want base 5", r, err)
	}
	r, _, _ = h.do(ReqGetVringBase, 0, state(0, 0))
	if !bytes.Equal(r, state(0, 2)) {
		t.Fatalf("GET_VRING_BASE(0) = %x, want base 2", r)
	}
	// Ring counters live in Stats and survived the rebuilds.
	if n := h.stats.Rings[1].Chains.Load(); n != 5 {
		t.Fatalf("ring 1 chains %d after rebuild", n)
	}
}

// TestMemoryTableChange re-sends SET_MEM_TABLE while the rings run (DPDK):
// pairs stop, ring addresses are translated against the new table, pairs
// restart where they stopped, and the old mapping is unmapped afterwards.
func TestMemoryTableChange(t *testing.T) {
	g1 := newGuestMem(t, testGPA, testUA, testSize)
	h := newHarness(t, 1)
	defer h.d.close()
	h.dp.onStart = drainPopper
	h.negotiate(OfferedProtocolFeatures)
	h.ok(ReqSetMemTable, table(g1.spec), g1.dupFD(t))
	g1.offer(1, 3, false)
	h.setupPair(g1, 0, true)
	old := h.d.slots[0].region
	oldQP, _ := h.dp.pair(0)
	h.dp.takeEvents()

	// New memory: another memfd at the same addresses, plus a second region.
	// The ring in it has moved on by 2 entries beyond what we consumed.
	g2 := newGuestMem(t, testGPA, testUA, testSize)
	copy(g2.bytes(), g1.bytes())
	g2.offer(1, 2, false)
	g3 := newGuestMem(t, 1<<30, testUA+1<<30, 1<<16)
	h.ok(ReqSetMemTable, table(g2.spec, g3.spec), g2.dupFD(t), g3.dupFD(t))
	if ev := h.dp.takeEvents(); ev != "stop 0,start 0" {
		t.Fatalf("events %q", ev)
	}
	if old.Bytes() != nil {
		t.Fatalf("old region still mapped")
	}
	newQP, _ := h.dp.pair(0)
	if newQP.TX == oldQP.TX {
		t.Fatalf("queue not rebuilt")
	}
	// The rebuilt TX queue started at base 3 and consumed the 2 new
	// entries in the new memory only.
	if newQP.TX.LastAvail() != 5 || g2.usedIdx(1) != 5 || g1.usedIdx(1) != 3 {
		t.Fatalf("last avail %d, used new %d old %d", newQP.TX.LastAvail(), g2.usedIdx(1), g1.usedIdx(1))
	}
	if len(h.d.mem.Regions()) != 2 {
		t.Fatalf("%d regions", len(h.d.mem.Regions()))
	}
	// A table without the rings' memory: the pair stays stopped, the
	// table change itself succeeds.
	h.ok(ReqSetMemTable, table(g3.spec), g3.dupFD(t))
	if ev := h.dp.takeEvents(); ev != "stop 0" || h.d.running[0] {
		t.Fatalf("events %q running %v", ev, h.d.running[0])
	}
	if h.stats.ErrorCount(ErrReasonDataPlane) != 1 {
		t.Fatalf("data-plane errors %d", h.stats.ErrorCount(ErrReasonDataPlane))
	}
}

// TestAddMemRegDedup reproduces QEMU queues=N: the same regions are added
// once per queue pair with new fds; the device maps each once, closes the
// extra fds, and unmaps only on the last removal.
func TestAddMemRegDedup(t *testing.T) {
	g := newGuestMem(t, testGPA, testUA, testSize)
	g2 := newGuestMem(t, 1<<30, testUA+1<<30, 1<<16)
	h := newHarness(t, 2)
	defer h.d.close()
	h.dp.onStart = drainPopper
	h.negotiate(OfferedProtocolFeatures)
	before := openFDs(t)
	h.ok(ReqAddMemReg, memReg(g.spec), g.dupFD(t))
	h.setupPair(g, 0, true)
	h.dp.takeEvents()
	afterFirst := openFDs(t)
	h.ok(ReqAddMemReg, memReg(g.spec), g.dupFD(t))
	if n := openFDs(t); n != afterFirst {
		t.Fatalf("duplicate region fd kept: %d open, %d before", n, afterFirst)
	}
	if len(h.d.slots) != 1 || h.d.slots[0].refs != 2 {
		t.Fatalf("slots %+v", h.d.slots)
	}
	if ev := h.dp.takeEvents(); ev != "" {
		t.Fatalf("duplicate region restarted pairs: %q", ev)
	}
	// A different region is added: pairs restart to see it.
	h.ok(ReqAddMemReg, memReg(g2.spec), g2.dupFD(t))
	if ev := h.dp.takeEvents(); ev != "stop 0,start 0" || len(h.d.mem.Regions()) != 2 {
		t.Fatalf("events %q regions %d", ev, len(h.d.mem.Regions()))
	}
	// Overlapping guest range: refused, nothing changes.
	bad := g2.spec
	bad.UserAddr += 1 << 32
	if _, _, err := h.do(ReqAddMemReg, 0, memReg(bad), g2.dupFD(t)); err == nil {
		t.Fatalf("overlapping region accepted")
	}
	region := h.d.slots[0].region
	h.ok(ReqRemMemReg, memReg(g.spec))
	if region.Bytes() == nil || len(h.d.slots) != 2 {
		t.Fatalf("region unmapped while still referenced")
	}
	h.ok(ReqRemMemReg, memReg(g.spec))
	if region.Bytes() != nil || len(h.d.slots) != 1 {
		t.Fatalf("region still mapped after last removal")
	}
	if ev := h.dp.takeEvents(); ev != "stop 0" {
		t.Fatalf("events %q", ev)
	}
	h.d.close()
	if n := openFDs(t); n > before {
		t.Fatalf("fds after close %d, before %d", n, before)
	}
}

func TestNoSharedMemory(t *testing.T) {
	h := newHarness(t, 1)
	defer h.d.close()
	h.negotiate(OfferedProtocolFeatures)
	h.ok(ReqSetMemTable, table())
	if _, _, err := h.do(ReqSetVringAddr, 0, addr(VringAddr{Desc: testUA, Avail: testUA + 0x1000, Used: testUA + 0x2000})); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ring address accepted without memory: %v", err)
	}
}

// TestUnsupportedRequestExpectingReply: a request the front-end waits a
// reply for is refused in that reply's failure encoding where the spec has
// one (NEED_REPLY changes nothing), and the connection goes where it has
// none; the session goes on after an encoded refusal.
func TestUnsupportedRequestExpectingReply(t *testing.T) {
	uuid := bytes.Repeat([]byte{0xab}, 16)
	for _, tc := range []struct {
		req     Request
		payload []byte
		want    []byte // nil: connection closed
	}{
		{req: ReqGetConfig, payload: make([]byte, 12+10), want: []byte{}},
		{req: ReqIOTLBMsg, payload: make([]byte, 40), want: u64(1)},
		{req: ReqPostcopyEnd, want: u64(1)},
		{req: ReqGetSharedObject, payload: uuid, want: u64(1)},
		{req: ReqGetInflightFD, payload: make([]byte, 24)},
		{req: ReqCreateCryptoSession, payload: make([]byte, 64)},
		{req: ReqPostcopyAdvise},
	} {
		for _, flags := range []uint32{0, FlagNeedReply} {
			t.Run(fmt.Sprintf("%v/flags=%#x", tc.req, flags), func(t *testing.T) {
				h := newHarness(t, 1)
				defer h.d.close()
				h.ok(ReqSetProtocolFeatures, u64(ProtocolReplyAck))
				r, send, err := h.do(tc.req, flags, tc.payload)
				if tc.want == nil {
					if err == nil || send {
						t.Fatalf("want connection closed, got reply %x send %v err %v", r, send, err)
					}
				} else if err != nil || !send || !bytes.Equal(r, tc.want) {
					t.Fatalf("reply %x send %v err %v, want %x", r, send, err, tc.want)
				}
				if h.stats.ErrorCount(ErrReasonUnsupported) != 1 {
					t.Fatalf("unsupported errors %d", h.stats.ErrorCount(ErrReasonUnsupported))
				}
			})
		}
	}
	// Over a socket: the empty GET_CONFIG reply is framed, and the session
	// keeps serving.
	fe, done := session(t, DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t)})
	if p := fe.call(ReqGetConfig, 0, make([]byte, 12+6)); len(p) != 0 {
		t.Fatalf("GET_CONFIG reply %x, want empty", p)
	}
	fe.sync()
	fe.c.Close()
	if err := <-done; err != nil {
		t.Fatalf("session: %v", err)
	}
}

func TestOfferedFeaturesMasked(t *testing.T) {
	d := newDevice(DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t),
		Features: DefaultFeatures&^FeatureLogAll | 1<<virtqueue.FeatureRingPacked | 1<<virtqueue.FeatureNetCsum})
	defer d.close()
	// LOG_ALL is offered as configured (DefaultFeatures has it).
	if d.offered != DefaultFeatures&^FeatureLogAll|1<<virtqueue.FeatureNetCsum {
		t.Fatalf("offered %#x", d.offered)
	}
}

// TestRegionBeyondFile: mmap accepts a range past the end of the file but
// touching it is a SIGBUS, so such regions are refused up front.
func TestRegionBeyondFile(t *testing.T) {
	g := newGuestMem(t, testGPA, testUA, testSize)
	h := newHarness(t, 1)
	defer h.d.close()
	big := g.spec
	big.Size *= 2
	if _, _, err := h.do(ReqAddMemReg, 0, memReg(big), g.dupFD(t)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("region larger than its file accepted: %v", err)
	}
	off := g.spec
	off.MmapOffset = testSize + 4096
	if _, _, err := h.do(ReqSetMemTable, 0, table(off), g.dupFD(t)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("offset beyond the file accepted: %v", err)
	}
	if len(h.d.slots) != 0 {
		t.Fatalf("slots %d", len(h.d.slots))
	}
}

// TestMemoryShrunkUnderUs: the front-end truncates its memory file after
// handing it over; building a queue then faults. The control goroutine
// (SetPanicOnFault, as in serveSession) turns that into a closed connection.
func TestMemoryShrunkUnderUs(t *testing.T) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	g := newGuestMem(t, testGPA, testUA, testSize)
	h := newHarness(t, 1)
	defer h.d.close()
	h.negotiate(OfferedProtocolFeatures)
	h.ok(ReqAddMemReg, memReg(g.spec), g.dupFD(t))
	for i := 0; i < 2; i++ {
		h.ok(ReqSetVringNum, state(uint32(i), testRingSize))
		h.ok(ReqSetVringAddr, addr(g.ringAddr(i)))
	}
	h.ok(ReqSetVringKick, u64(0), eventfd(t))
	if err := unix.Ftruncate(g.mem.FD(), 0); err != nil {
		t.Fatal(err)
	}
	_, send, err := h.do(ReqSetVringKick, 0, u64(1), eventfd(t))
	if !errors.Is(err, errMemory) || send {
		t.Fatalf("fault not turned into an error: send=%v err=%v", send, err)
	}
	if h.d.running[0] || h.stats.ErrorCount(ErrReasonMemory) != 1 {
		t.Fatalf("running %v memory errors %d", h.d.running[0], h.stats.ErrorCount(ErrReasonMemory))
	}
}

func TestAddMemRegSlotLimit(t *testing.T) {
	const page = 4096
	g := newGuestMem(t, 0, testUA, (MaxMemSlots+1)*page)
	h := newHarness(t, 1)
	defer h.d.close()
	h.ok(ReqSetProtocolFeatures, u64(ProtocolReplyAck|ProtocolConfigureMemSlots))
	region := func(i int) MemRegion {
		// Non-adjacent guest and user ranges, each backed by its own page.
		return MemRegion{GuestAddr: uint64(i) * 2 * page, Size: page, UserAddr: testUA + uint64(i)*2*page, MmapOffset: uint64(i) * page}
	}
	for i := 0; i < MaxMemSlots; i++ {
		if r, _, err := h.do(ReqAddMemReg, FlagNeedReply, memReg(region(i)), g.dupFD(t)); err != nil || !bytes.Equal(r, u64(0)) {
			t.Fatalf("region %d: %x %v", i, r, err)
		}
	}
	if r, _, err := h.do(ReqAddMemReg, FlagNeedReply, memReg(region(MaxMemSlots)), g.dupFD(t)); err != nil || !bytes.Equal(r, u64(1)) {
		t.Fatalf("region beyond the slot limit: %x %v", r, err)
	}
	if len(h.d.slots) != MaxMemSlots || len(h.d.mem.Regions()) != MaxMemSlots {
		t.Fatalf("slots %d regions %d", len(h.d.slots), len(h.d.mem.Regions()))
	}
}

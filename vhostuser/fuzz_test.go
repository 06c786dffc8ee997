package vhostuser

import (
	"bytes"
	"io"
	"log/slog"
	"testing"
	"unsafe"

	"vunet/virtqueue"
)

// fuzzMemSize is the guest memory the fuzzed device starts with, so that
// fd-less messages (polling kicks, no call fd) can get rings running.
const fuzzMemSize = 256 << 10

var fuzzMem = make([]byte, fuzzMemSize)

// fuzzLog is the dirty log the fuzzed device has from the start (as if
// SET_LOG_BASE had come: the fuzzer sends no fds), covering 128 pages, less
// than the guest memory, so hostile log addresses land inside and outside.
var fuzzLog = make([]uint64, 2)

func fuzzSeeds() [][]byte {
	msg := func(req Request, flags uint32, payload []byte) []byte {
		return rawMsg(req, FlagVersion1|flags, uint32(len(payload)), payload)
	}
	g := &guestMem{spec: MemRegion{GuestAddr: testGPA, Size: fuzzMemSize, UserAddr: testUA}}
	var setup []byte
	setup = append(setup, msg(ReqGetFeatures, 0, nil)...)
	setup = append(setup, msg(ReqGetProtocolFeatures, 0, nil)...)
	setup = append(setup, msg(ReqSetProtocolFeatures, 0, u64(OfferedProtocolFeatures))...)
	setup = append(setup, msg(ReqSetFeatures, 0, u64(DefaultFeatures))...)
	setup = append(setup, msg(ReqSetOwner, FlagNeedReply, nil)...)
	for i := 0; i < 2; i++ {
		setup = append(setup, msg(ReqSetVringNum, 0, state(uint32(i), testRingSize))...)
		setup = append(setup, msg(ReqSetVringBase, 0, state(uint32(i), 0))...)
		setup = append(setup, msg(ReqSetVringAddr, FlagNeedReply, addr(g.ringAddr(i)))...)
		setup = append(setup, msg(ReqSetVringKick, 0, u64(uint64(i)|VringNoFDFlag))...)
		setup = append(setup, msg(ReqSetVringCall, 0, u64(uint64(i)|VringNoFDFlag))...)
		setup = append(setup, msg(ReqSetVringEnable, FlagNeedReply, state(uint32(i), 1))...)
	}
	running := append([]byte(nil), setup...)
	running = append(running, msg(ReqSetVringNum, FlagNeedReply, state(1, 16))...)
	running = append(running, msg(ReqGetVringBase, 0, state(1, 0))...)
	running = append(running, msg(ReqRemMemReg, FlagNeedReply, memReg(g.spec))...)
	running = append(running, msg(ReqSetMemTable, 0, table())...)
	running = append(running, msg(ReqResetDevice, 0, nil)...)
	// A migration: LOG_ALL, the rings' used rings logged (one beyond the
	// log), the log refused for want of its fd, LOG_ALL off.
	migrating := append([]byte(nil), setup...)
	for i := 0; i < 2; i++ {
		a := g.ringAddr(i)
		a.Flags, a.Log = VringFlagLog, a.Used-testUA+uint64(i)<<30
		migrating = append(migrating, msg(ReqSetVringAddr, FlagNeedReply, addr(a))...)
	}
	migrating = append(migrating, msg(ReqSetLogBase, 0, LogDesc{Size: 64}.Encode(nil))...)
	migrating = append(migrating, msg(ReqSetLogFD, 0, nil)...)
	migrating = append(migrating, msg(ReqSetFeatures, FlagNeedReply, u64(DefaultFeatures&^FeatureLogAll))...)
	misc := msg(ReqNetSetMTU, FlagNeedReply, u64(1500))
	misc = append(misc, msg(ReqSendRARP, 0, []byte{2, 0, 0, 0, 0, 1, 0, 0})...)
	misc = append(misc, msg(ReqSetStatus, 0, u64(0xf))...)
	misc = append(misc, msg(ReqGetStatus, 0, nil)...)
	misc = append(misc, msg(Request(77), FlagNeedReply, []byte("unknown"))...)
	misc = append(misc, msg(ReqGetQueueNum, 0, nil)...)
	misc = append(misc, msg(ReqGetMaxMemSlots, 0, nil)...)
	return [][]byte{
		setup, running, misc, migrating,
		msg(ReqSetMemTable, 0, table(MemRegion{Size: 4096})),
		msg(ReqAddMemReg, 0, memReg(MemRegion{Size: 4096})),
		bytes.Repeat([]byte{0xff}, 32),
		{1, 0, 0, 0, 1, 0, 0, 0},
	}
}

// FuzzDecodeMessage feeds arbitrary bytes through the message decoder and
// the device state machine (with a recording data plane and guest memory
// the fuzzer also writes): nothing may panic, the data plane's start/stop
// calls must pair up, replies must be well-formed, and a REPLY_ACK request
// must never close the connection.
func FuzzDecodeMessage(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		clear(fuzzMem)
		copy(fuzzMem[0x10000:], data) // ring 0's descriptor table and beyond
		dp := newFakeDP()
		dp.onStart = drainPopper
		d := newDevice(DeviceConfig{QueuePairs: 2, DataPlane: dp, Logger: log})
		spec := virtqueue.RegionSpec{GuestAddr: testGPA, Size: fuzzMemSize, UserAddr: testUA}
		reg, err := virtqueue.NewRegion(spec, fuzzMem)
		if err != nil {
			t.Fatal(err)
		}
		d.slots = []memSlot{{region: reg, refs: 1}}
		clear(fuzzLog)
		if d.dirtyLog, err = virtqueue.NewDirtyLog(unsafe.Slice((*byte)(unsafe.Pointer(&fuzzLog[0])), 8*len(fuzzLog))); err != nil {
			t.Fatal(err)
		}
		if d.mem, err = virtqueue.NewMemory([]*virtqueue.Region{reg}); err != nil {
			t.Fatal(err)
		}
		rest := data
		for n := 0; n < 64 && len(rest) > 0; n++ {
			h, payload, next, err := DecodeMessage(rest)
			if err != nil {
				break
			}
			rest = next
			m := Message{Header: h, Payload: payload}
			// Requests with a reply format of their own get that reply (or
			// its failure encoding, or a closed connection where the spec
			// has none), never a REPLY_ACK u64.
			ackable := h.Flags&FlagNeedReply != 0 && !expectsReply(h.Request)
			reply, send, err := d.process(&m)
			// Replies are one u64 or a vring state (8 bytes), except the
			// spec's failure encoding of GET_CONFIG: an empty payload.
			if err == nil && send && len(reply) != 8 && !(h.Request == ReqGetConfig && len(reply) == 0) {
				t.Fatalf("%v: reply of %d bytes", h.Request, len(reply))
			}
			if err != nil && send {
				t.Fatalf("%v: reply and close", h.Request)
			}
			if ackable && d.protocol&ProtocolReplyAck != 0 && (err != nil || !send) {
				t.Fatalf("%v with NEED_REPLY under REPLY_ACK: send=%v err=%v", h.Request, send, err)
			}
		}
		d.close()
		if n := dp.runningCount(); n != 0 {
			t.Fatalf("%d pairs still running after close", n)
		}
	})
}

// FuzzReadMessage checks the socket decoder against DecodeMessage on the
// same bytes: same headers, same payloads, errors at the same message.
func FuzzReadMessage(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 64<<10 {
			return // larger than the socket buffer: the write would block
		}
		a, b := socketPair(t)
		defer a.Close()
		c, err := NewConn(b)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := a.Write(data); err != nil {
			t.Fatal(err)
		}
		a.CloseWrite()
		rest := data
		var m Message
		for {
			h, payload, next, derr := DecodeMessage(rest)
			rerr := c.ReadMessage(&m)
			if len(rest) == 0 {
				if rerr != io.EOF {
					t.Fatalf("end of stream: %v", rerr)
				}
				return
			}
			if (derr == nil) != (rerr == nil) {
				t.Fatalf("DecodeMessage err %v, ReadMessage err %v", derr, rerr)
			}
			if derr != nil {
				return
			}
			if m.Header != h || !bytes.Equal(m.Payload, payload) || len(m.FDs) != 0 {
				t.Fatalf("ReadMessage %+v %x, DecodeMessage %+v %x", m.Header, m.Payload, h, payload)
			}
			rest = next
		}
	})
}

// TestFuzzSeedReachesRunningPair keeps the fuzz harness honest: its first
// seed must get a pair running on fd-less rings, so fuzzing explores the
// states after start-up too.
func TestFuzzSeedReachesRunningPair(t *testing.T) {
	dp := newFakeDP()
	d := newDevice(DeviceConfig{QueuePairs: 2, DataPlane: dp, Logger: testLogger(t)})
	defer d.close()
	reg, _ := virtqueue.NewRegion(virtqueue.RegionSpec{GuestAddr: testGPA, Size: fuzzMemSize, UserAddr: testUA}, make([]byte, fuzzMemSize))
	d.slots = []memSlot{{region: reg, refs: 1}}
	d.mem, _ = virtqueue.NewMemory([]*virtqueue.Region{reg})
	rest := fuzzSeeds()[0]
	for len(rest) > 0 {
		h, p, next, err := DecodeMessage(rest)
		if err != nil {
			t.Fatal(err)
		}
		rest = next
		m := Message{Header: h, Payload: p}
		if _, _, err := d.process(&m); err != nil {
			t.Fatalf("%v: %v", h.Request, err)
		}
	}
	if qp, ok := dp.pair(0); !ok || !qp.RXEnabled || !qp.TXEnabled {
		t.Fatalf("pair 0 not running enabled: %+v %v", qp, ok)
	}
}

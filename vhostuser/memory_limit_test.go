package vhostuser

import (
	"bytes"
	"testing"
)

// TestMemoryLimit: the total of distinct mapped regions is capped, for
// SET_MEM_TABLE (the whole new table) and ADD_MEM_REG (what is mapped plus
// the new region); duplicates of a mapped region cost nothing; a refusal
// is a failure ack counted as memory_limit and changes nothing.
func TestMemoryLimit(t *testing.T) {
	const page = 4096
	g := newGuestMem(t, 0, testUA, 8*page)
	st := &Stats{}
	d := newDevice(DeviceConfig{DataPlane: newFakeDP(), Logger: testLogger(t), Stats: st, MaxMemory: 3 * page})
	h := &harness{t: t, d: d, dp: d.dp.(*fakeDP), stats: st}
	defer h.d.close()
	h.ok(ReqSetProtocolFeatures, u64(ProtocolReplyAck|ProtocolConfigureMemSlots))
	region := func(i, pages int) MemRegion {
		return MemRegion{GuestAddr: uint64(i) * 4 * page, Size: uint64(pages) * page, UserAddr: testUA + uint64(i)*4*page, MmapOffset: uint64(i) * page}
	}
	ack := func(req Request, payload []byte, fds ...int) uint64 {
		t.Helper()
		r, _, err := h.do(req, FlagNeedReply, payload, fds...)
		if err != nil || len(r) != 8 {
			t.Fatalf("%v: reply %x err %v", req, r, err)
		}
		if bytes.Equal(r, u64(0)) {
			return 0
		}
		return 1
	}

	if ack(ReqSetMemTable, table(region(0, 2), region(1, 2)), g.dupFD(t), g.dupFD(t)) == 0 {
		t.Fatal("4-page table accepted under a 3-page limit")
	}
	if len(h.d.slots) != 0 || st.GuestMemory.Load() != 0 {
		t.Fatalf("refused table left %d slots, gauge %d", len(h.d.slots), st.GuestMemory.Load())
	}
	if ack(ReqSetMemTable, table(region(0, 2)), g.dupFD(t)) != 0 {
		t.Fatal("2-page table refused")
	}
	if ack(ReqAddMemReg, memReg(region(0, 2)), g.dupFD(t)) != 0 {
		t.Fatal("duplicate of a mapped region refused")
	}
	if ack(ReqAddMemReg, memReg(region(1, 2)), g.dupFD(t)) == 0 {
		t.Fatal("region past the limit accepted")
	}
	if ack(ReqAddMemReg, memReg(region(1, 1)), g.dupFD(t)) != 0 {
		t.Fatal("region up to the limit refused")
	}
	if got := st.GuestMemory.Load(); got != 3*page {
		t.Fatalf("guest memory gauge %d, want %d", got, 3*page)
	}
	// Replacing the table: only the new table counts.
	if ack(ReqSetMemTable, table(region(2, 3)), g.dupFD(t)) != 0 {
		t.Fatal("3-page replacement table refused")
	}
	if got := st.ErrorCount(ErrReasonMemoryLimit); got != 2 {
		t.Fatalf("memory_limit errors %d, want 2", got)
	}
	h.d.close()
	if st.GuestMemory.Load() != 0 {
		t.Fatal("guest memory gauge not cleared at the end of the session")
	}
}

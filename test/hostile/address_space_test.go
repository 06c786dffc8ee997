package hostile

import (
	"runtime"
	"testing"

	fe "vunet/test/frontend"
	"vunet/vhostuser"
)

// TestAddressSpaceCap maps a sparse 64 TiB memfd again and again through
// ADD_MEM_REG at halving sizes: nothing is committed, but each mapping
// reserves address space, and past ~128 TiB the next Go heap growth dies
// with "fatal error: out of memory" (x86-64 user space is 128 TiB). The
// server must refuse every region past its cap on total mapped guest
// memory, count it, and stay able to allocate and serve.
func TestAddressSpaceCap(t *testing.T) {
	isolate(t, func(t *testing.T) {
		s := startServer(t)
		f := s.connect(t, fe.Options{})
		fd := memfd(t, 64<<40)
		const ua, gpa = 0x1000_0000_0000, 1 << 50
		var accepted, refused int
		var mapped uint64
		for i := 0; i < 29; i++ {
			size := uint64(64<<40) >> i
			// Regions side by side in both address spaces, none
			// overlapping what the front-end already sent.
			r := fe.Region{GuestAddr: gpa + uint64(i)<<47, Size: size, UserAddr: ua + uint64(i)<<47}
			switch o := try(t, f, fe.ReqAddMemReg, fe.PayloadMemReg(r), []int{fd}); o {
			case outAccepted:
				accepted++
				mapped += size
			case outNack:
				refused++
			default:
				t.Fatalf("region %d (%d GiB): connection %v", i, size>>30, o)
			}
		}
		closeCaseFDs()
		t.Logf("%d regions accepted (%d GiB), %d refused", accepted, mapped>>30, refused)
		if refused == 0 {
			t.Fatal("no region refused: the total mapped size is not capped")
		}
		if total := mapped + f.Mem.Size(); total > vhostuser.DefaultMaxMemory {
			t.Errorf("%d GiB mapped, more than the default cap of %d GiB", total>>30, vhostuser.DefaultMaxMemory>>30)
		}
		if got := s.stats.ErrorCount(vhostuser.ErrReasonMemoryLimit); got != uint64(refused) {
			t.Errorf("memory_limit errors counted: %d, want %d", got, refused)
		}
		if got := s.stats.GuestMemory.Load(); got != mapped+f.Mem.Size() {
			t.Errorf("guest memory gauge %d, want %d", got, mapped+f.Mem.Size())
		}
		// The heap can still grow (a fresh arena needs address space).
		var keep [][]byte
		for i := 0; i < 8; i++ {
			keep = append(keep, make([]byte, 256<<20))
		}
		runtime.KeepAlive(keep)
		exchange(t, f)
		f.Close()
		s.healthy(t)
	})
}

package virtqueue_test

import (
	"testing"

	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

// BenchmarkPopPush measures the steady state of one queue: the driver
// re-offers the same chains, the device pops, pushes and flushes.
func BenchmarkPopPush(b *testing.B) {
	for _, bc := range []struct {
		name     string
		descs    int
		batch    int
		eventIdx bool
		call     bool
	}{
		{"1desc", 1, 1, false, false},
		{"2desc", 2, 1, false, false},
		{"2desc-batch32", 2, 32, false, false},
		{"1desc-eventidx-call", 1, 1, true, true},
		{"1desc-call", 1, 1, false, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := newRig(b, rigOpt{size: 256, eventIdx: bc.eventIdx, call: bc.call})
			heads := make([]uint16, bc.batch)
			for i := range heads {
				bufs := []vqtest.Buf{{GPA: r.d.Alloc(12), Len: 12}, {GPA: r.d.Alloc(1514), Len: 1514}}
				h, err := r.d.AddChain(bufs[:bc.descs]...)
				if err != nil {
					b.Fatal(err)
				}
				heads[i] = h
			}
			r.d.Publish(bc.eventIdx)
			var c virtqueue.Chain
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += bc.batch {
				for range bc.batch {
					ok, err := r.q.Pop(&c)
					if !ok || err != nil {
						b.Fatal(ok, err)
					}
					r.q.Push(c.Head, 0)
				}
				r.q.Flush()
				for _, h := range heads {
					r.d.PutAvail(h)
				}
				r.d.Publish(bc.eventIdx)
			}
		})
	}
}

func BenchmarkNetHdr(b *testing.B) {
	wire := []byte{0x01, 0x81, 0x02, 0x01, 0xa8, 0x05, 0x22, 0x00, 0x10, 0x00, 0x03, 0x00}
	out := make([]byte, virtqueue.NetHdrLen)
	var h virtqueue.NetHdr
	b.ReportAllocs()
	for b.Loop() {
		if err := h.Decode(wire); err != nil {
			b.Fatal(err)
		}
		h.NumBuffers++
		h.Encode(out)
	}
}

// BenchmarkChainCopy measures taking 66 header bytes (virtio-net + 54) out of a two-segment
// TX chain and writing one into an RX chain.
func BenchmarkChainCopy(b *testing.B) {
	r := newRig(b, rigOpt{size: 16})
	c := chainOf(b, r, []uint32{12, 1514}, []uint32{40, 1514})
	var hdr [66]byte
	b.ReportAllocs()
	for b.Loop() {
		if c.CopyReadable(hdr[:], 0) != len(hdr) || c.CopyToWritable(0, hdr[:]) != len(hdr) {
			b.Fatal("short copy")
		}
	}
}

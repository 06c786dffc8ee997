package guestring

import (
	"bytes"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

// TestRXWriterRandomized drives the RX writer directly with random guest
// buffer layouts and a random mix of copied frames and Reserve/Commit/Abort
// sequences (several reservations outstanding, short commits), then checks
// from the driver side that exactly the accepted frames arrived, intact and
// in order, and that every chain popped was either used or rewound.
func TestRXWriterRandomized(t *testing.T) {
	for seed := uint64(0); seed < 150; seed++ {
		rng := rand.New(rand.NewPCG(seed, 42))
		feat := uint64(featModern)
		if seed%2 == 1 {
			feat = featMrg
		}
		ring, hdrLen := newTestRing(t, feat, 256)
		var w Writer
		w.Init(ring.Q, new(stats.Queue), testLogger, feat, true)
		nChains := 1 + rng.IntN(200)
		for i := 0; i < nChains && ring.Free() >= 3; i++ {
			var bufs []uint32
			for d := 0; d < 1+rng.IntN(3); d++ {
				bufs = append(bufs, uint32(1+rng.IntN(3000)))
			}
			ring.AddBuffers(nil, bufs...)
		}
		ring.Post()

		var want [][]byte
		pattern := func(n int) []byte {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			return b
		}
		for op := 0; op < 300; op++ {
			switch rng.IntN(5) {
			case 0, 1:
				f := pattern(header.EthernetMinimumSize + rng.IntN(9000))
				if w.WriteFrame(f, 0) == OK {
					want = append(want, f)
				}
			case 2, 3:
				k := 1 + rng.IntN(3)
				type res struct {
					hdr []byte
					pay [][]byte
					h   []byte
				}
				var rs []res
				for j := 0; j < k; j++ {
					hl := header.EthernetMinimumSize + rng.IntN(120)
					hdr, pay, st := w.Reserve(hl, rng.IntN(20000))
					if st != OK {
						break
					}
					if len(hdr) != hl {
						t.Fatalf("seed %d: header %d bytes, want %d", seed, len(hdr), hl)
					}
					h := pattern(hl)
					copy(hdr, h)
					rs = append(rs, res{hdr, append([][]byte(nil), pay...), h})
				}
				commit := rng.IntN(len(rs) + 1)
				for j := 0; j < commit; j++ {
					total := 0
					for _, b := range rs[j].pay {
						total += len(b)
					}
					n := rng.IntN(total + 1)
					data := pattern(n)
					rest := data
					for _, b := range rs[j].pay {
						rest = rest[copy(b, rest):]
					}
					w.Commit(n, &virtqueue.NetHdr{})
					want = append(want, append(append([]byte(nil), rs[j].h...), data...))
				}
				w.Abort()
			default:
				w.Publish()
			}
		}
		w.Publish()

		var got [][]byte
		for {
			u, ok := ring.PopUsed()
			if !ok {
				break
			}
			head, n := uint16(u.ID), u.Len
			if int(n) < hdrLen {
				continue // a chain given back empty
			}
			b := ring.Written(head, n)
			var h virtqueue.NetHdr
			h.Decode(b[:hdrLen])
			data := append([]byte(nil), b[hdrLen:]...)
			if feat&(1<<virtqueue.FeatureNetMrgRxbuf) == 0 && h.NumBuffers != 1 {
				t.Fatalf("seed %d: num_buffers %d without MRG_RXBUF", seed, h.NumBuffers)
			}
			for i := 1; i < int(h.NumBuffers); i++ {
				u, ok := ring.PopUsed()
				if !ok {
					t.Fatalf("seed %d: frame cut short", seed)
				}
				data = append(data, ring.Written(uint16(u.ID), u.Len)...)
			}
			got = append(got, data)
		}
		if len(got) != len(want) {
			t.Fatalf("seed %d: %d frames arrived, want %d", seed, len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("seed %d: frame %d differs (len %d vs %d)", seed, i, len(got[i]), len(want[i]))
			}
		}
		if la, used := ring.Q.LastAvail(), ring.UsedIdx(); la != used {
			t.Fatalf("seed %d: LastAvail %d but %d used: chains leaked or double-used", seed, la, used)
		}
	}
}

const (
	featModern = 1<<virtqueue.FeatureVersion1 | 1<<virtqueue.FeatureRingEventIdx
	featMrg    = featModern | 1<<virtqueue.FeatureNetMrgRxbuf
)

var testLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// newTestRing is a guest RX ring of size entries with its device queue
// built, and the virtio-net header length features give.
func newTestRing(t testing.TB, features uint64, size uint16) (*vqtest.Ring, int) {
	t.Helper()
	m, err := vqtest.NewFlatMemory(16 << 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	r, err := vqtest.NewRing(m, size, 0, 1<<20, 15<<20, virtqueue.HasFeature(features, virtqueue.FeatureRingEventIdx))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	if err := r.Rebuild(r.QueueConfig(0, 0)); err != nil {
		t.Fatal(err)
	}
	return r, virtqueue.NetHdrLenFor(features)
}

package tcpstack

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"vunet/virtqueue"
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
		p := newTestPair(t, feat, 256)
		l := benchLoop(t, p)
		w := &l.rx
		nChains := 1 + rng.IntN(200)
		for i := 0; i < nChains && p.rx.Free() >= 3; i++ {
			var bufs []uint32
			for d := 0; d < 1+rng.IntN(3); d++ {
				bufs = append(bufs, uint32(1+rng.IntN(3000)))
			}
			p.rx.AddBuffers(nil, bufs...)
		}
		p.rx.Post()

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
				f := pattern(ethHdrLen + rng.IntN(9000))
				if w.writeFrame(f, 0) == rxOK {
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
					hl := ethHdrLen + rng.IntN(120)
					hdr, pay, ok := w.Reserve(hl, rng.IntN(20000))
					if !ok {
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
				w.publish()
			}
		}
		w.publish()

		var got [][]byte
		for {
			head, n, ok := p.rx.popUsed()
			if !ok {
				break
			}
			if int(n) < p.hdrLen {
				continue // a chain given back empty
			}
			b := p.rx.Written(head, n)
			var h virtqueue.NetHdr
			h.Decode(b[:p.hdrLen])
			data := append([]byte(nil), b[p.hdrLen:]...)
			if feat&(1<<virtqueue.FeatureNetMrgRxbuf) == 0 && h.NumBuffers != 1 {
				t.Fatalf("seed %d: num_buffers %d without MRG_RXBUF", seed, h.NumBuffers)
			}
			for i := 1; i < int(h.NumBuffers); i++ {
				head, n, ok := p.rx.popUsed()
				if !ok {
					t.Fatalf("seed %d: frame cut short", seed)
				}
				data = append(data, p.rx.Written(head, n)...)
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
		if la, used := p.rx.Q.LastAvail(), p.rx.UsedIdx(); la != used {
			t.Fatalf("seed %d: LastAvail %d but %d used: chains leaked or double-used", seed, la, used)
		}
	}
}

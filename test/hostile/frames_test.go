package hostile

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	fe "vunet/test/frontend"
)

// frameCase is a batch of well-formed chains carrying garbage: the rings
// are fine, the bytes are not. Every chain must come back used, nothing may
// count as a bad chain, and the pair must go on answering ARP.
type frameCase struct {
	name   string
	opts   fe.Options
	shape  fe.ChainShape
	hdr    fe.NetHdr
	frames func() [][]byte
}

func eth(ethertype uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], ourMAC[:])
	copy(b[6:12], guestMAC[:])
	binary.BigEndian.PutUint16(b[12:], ethertype)
	return append(b, payload...)
}

func randomFrames(seed uint64, n, maxLen int) [][]byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([][]byte, n)
	for i := range out {
		b := make([]byte, r.IntN(maxLen+1))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		out[i] = b
	}
	return out
}

// ipv4 returns a 20-byte IPv4 header claiming totalLen and proto.
func ipv4(totalLen uint16, proto byte, ihl byte) []byte {
	h := make([]byte, 20)
	h[0] = 0x40 | ihl
	binary.BigEndian.PutUint16(h[2:], totalLen)
	h[8] = 64
	h[9] = proto
	copy(h[12:16], guestIP[:])
	copy(h[16:20], gwIP[:])
	return h
}

var frameCases = []frameCase{
	{name: "random bytes", frames: func() [][]byte { return randomFrames(1, 200, 1600) }},
	{name: "random bytes split like DPDK", shape: fe.ChainShape{HeaderApart: true}, frames: func() [][]byte { return randomFrames(2, 100, 1600) }},
	{name: "random bytes in 7-byte descriptors", shape: fe.ChainShape{Chunk: 7}, opts: fe.Options{RingSize: 1024},
		frames: func() [][]byte { return randomFrames(3, 50, 200) }},
	{name: "random bytes indirect", shape: fe.ChainShape{Indirect: true, Chunk: 100}, frames: func() [][]byte { return randomFrames(4, 100, 1600) }},
	{name: "random ethertypes over valid ethernet", frames: func() [][]byte {
		var out [][]byte
		for _, et := range []uint16{0x0800, 0x86dd, 0x0806, 0x8100, 0x88cc, 0x0000, 0xffff} {
			for _, p := range randomFrames(uint64(et), 20, 600) {
				out = append(out, eth(et, p))
			}
		}
		return out
	}},
	{name: "truncated headers", frames: func() [][]byte {
		return [][]byte{
			{},
			{0x01},
			arpRequest()[:5],
			arpRequest()[:13],
			arpRequest()[:14],
			arpRequest()[:20],
			arpRequest()[:41],
			eth(0x0800, nil),
			eth(0x0800, ipv4(20, 6, 5)[:10]),
			eth(0x0800, ipv4(1500, 6, 5)),     // total length beyond the frame
			eth(0x0800, ipv4(20, 6, 15)),      // IHL beyond the frame
			eth(0x0800, ipv4(10, 17, 5)),      // total length below the header
			eth(0x0800, ipv4(28, 17, 5)[:20]), // UDP header missing
			eth(0x0800, append(ipv4(40, 6, 5), make([]byte, 4)...)),                              // TCP cut
			eth(0x0800, append(ipv4(28, 1, 5), 8, 0)),                                            // ICMP cut
			eth(0x86dd, make([]byte, 20)),                                                        // IPv6 cut
			eth(0x86dd, append([]byte{0x60, 0, 0, 0, 0xff, 0xff, 58, 255}, make([]byte, 32)...)), // payload length lies
			eth(0x8100, []byte{0, 1}),                                                            // VLAN tag cut
		}
	}},
	{name: "garbage virtio-net header", hdr: fe.NetHdr{Flags: 0xff, GSOType: 0x7f, HdrLen: 0xffff, GSOSize: 1, CsumStart: 0xffff, CsumOffset: 0xffff, NumBuffers: 0xffff},
		frames: func() [][]byte { return append(randomFrames(5, 20, 1500), arpRequest()) }},
	{name: "checksum offload pointing past the frame", hdr: fe.NetHdr{Flags: fe.NetHdrFNeedsCsum, CsumStart: 60, CsumOffset: 1000},
		frames: func() [][]byte {
			return [][]byte{eth(0x0800, append(ipv4(28, 17, 5), make([]byte, 8)...)), arpRequest()}
		}},
	{name: "TSO header on a tiny frame", hdr: fe.NetHdr{Flags: fe.NetHdrFNeedsCsum, GSOType: fe.GSOTCPv4, HdrLen: 54, GSOSize: 1, CsumStart: 34, CsumOffset: 16},
		frames: func() [][]byte {
			return [][]byte{eth(0x0800, append(ipv4(40, 6, 5), make([]byte, 20)...)), arpRequest()}
		}},
	{name: "64 KiB frames", shape: fe.ChainShape{Chunk: 4096}, frames: func() [][]byte {
		big := eth(0x0800, append(ipv4(65535, 17, 5), make([]byte, 65535-20)...))
		return [][]byte{big, randomFrames(6, 1, 65550)[0]}
	}},
}

func TestHostileFrames(t *testing.T) {
	for _, pl := range framePlanes {
		for _, c := range frameCases {
			t.Run(pl.name+"/"+c.name, func(t *testing.T) {
				isolate(t, func(t *testing.T) { runFrameCase(t, pl, c) })
			})
		}
	}
}

func runFrameCase(t *testing.T, pl namedPlane, c frameCase) {
	s := startServerWith(t, pl.make(t))
	s.healthy(t)
	f := s.connect(t, c.opts)
	p := f.Pair0()
	exchange(t, f)
	p.TXShape = c.shape
	bad := s.stats.Rings[1].BadChains.Load()
	chains := s.stats.Rings[1].Chains.Load()
	frames := c.frames()
	// Submit in batches the ring can hold.
	for len(frames) > 0 {
		n := min(len(frames), 32)
		if err := p.SubmitTXHdr(c.hdr, frames[:n]...); err != nil {
			t.Fatal(err)
		}
		if err := p.WaitTX(3 * time.Second); err != nil {
			t.Fatal(err)
		}
		frames = frames[n:]
	}
	if got := s.stats.Rings[1].BadChains.Load(); got != bad {
		t.Errorf("%d well-formed chains counted as bad", got-bad)
	}
	if got, want := s.stats.Rings[1].Chains.Load()-chains, uint64(len(c.frames())); got != want {
		t.Errorf("Chains moved by %d, want %d", got, want)
	}
	p.TXShape = fe.ChainShape{}
	// Any replies the garbage provoked are drained before the check.
	p.ReceiveRX(50 * time.Millisecond)
	exchangeSkipping(t, f)
	f.Close()
	s.healthy(t)
}

// exchangeSkipping is exchange that ignores frames other than the ARP
// reply (a real stack may answer some garbage, with ICMP errors or RSTs).
func exchangeSkipping(t *testing.T, f *fe.Frontend) {
	t.Helper()
	p := f.Pair0()
	if err := p.PostRX(16, 2048); err != nil {
		t.Fatal(err)
	}
	if err := p.SubmitTX(arpRequest()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		frames, err := p.ReceiveRX(time.Until(deadline))
		if err != nil {
			break
		}
		for _, fr := range frames {
			if len(fr.Data) >= 42 && binary.BigEndian.Uint16(fr.Data[12:]) == 0x0806 {
				checkARPReply(t, fr.Data)
				return
			}
		}
		if p.RX.Outstanding() < 4 {
			p.PostRX(8, 2048)
		}
	}
	t.Fatal("no ARP reply after the garbage")
}

// TestNoRXBuffersFlood sends thousands of frames that each want an answer
// while the guest posts no RX buffers: TX must keep being processed (no
// head-of-line blocking on a full RX ring), whatever is queued for the
// guest must stay bounded, and once buffers appear the pair works.
func TestNoRXBuffersFlood(t *testing.T) {
	for _, pl := range framePlanes {
		t.Run(pl.name, func(t *testing.T) {
			isolate(t, func(t *testing.T) {
				s := startServerWith(t, pl.make(t))
				f := s.connect(t, fe.Options{})
				p := f.Pair0()
				batch := make([][]byte, 64)
				for i := range batch {
					batch[i] = arpRequest()
				}
				for i := 0; i < 80; i++ {
					if err := p.SubmitTX(batch...); err != nil {
						t.Fatal(err)
					}
					if err := p.WaitTX(3 * time.Second); err != nil {
						t.Fatalf("batch %d: TX stalled while RX has no buffers: %v", i, err)
					}
				}
				if err := p.PostRX(256, 2048); err != nil {
					t.Fatal(err)
				}
				got := 0
				for {
					fr, err := p.ReceiveRX(200 * time.Millisecond)
					if err != nil {
						break
					}
					got += len(fr)
				}
				t.Logf("%d replies queued for the guest out of %d requests", got, 80*64)
				if got >= 80*64 {
					t.Errorf("every one of %d replies was kept for a guest without buffers: unbounded queue?", got)
				}
				exchangeSkipping(t, f)
				f.Close()
				s.healthy(t)
			})
		})
	}
}

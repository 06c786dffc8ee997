package tcpstack

import (
	"bytes"
	"testing"
	"time"

	"vunet/tcpstack/header"
)

// recordCapture keeps a copy of every captured frame. The loop goroutine
// writes it; tests read it after StopPair (which waits for the loop).
type recordCapture struct {
	frames [][]byte
	pairs  []int
}

func (c *recordCapture) Frame(pair int, iov [][]byte, skip, n int) {
	var f []byte
	for _, b := range iov {
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		f = append(f, b[skip:]...)
		skip = 0
	}
	if len(f) > n {
		f = f[:n]
	}
	c.frames = append(c.frames, f)
	c.pairs = append(c.pairs, pair)
}

// copyCapture copies frames into one fixed buffer, as a ring writer would.
type copyCapture struct {
	buf    [65536]byte
	frames int
}

func (c *copyCapture) Frame(pair int, iov [][]byte, skip, n int) {
	header.CopyFromIovecs(c.buf[:min(n, len(c.buf))], iov, skip)
	c.frames++
}

// TestCaptureSeesEveryFrame: every guest frame and every frame committed
// to the guest (service replies, announcements, socket data spanning
// several MRG_RXBUF buffers) reaches the capture byte for byte, once.
func TestCaptureSeesEveryFrame(t *testing.T) {
	for _, tc := range []struct {
		name string
		feat uint64
		buf  uint32
		size int // UDP payload echoed through a host socket
	}{
		{"modern", featModern, 2048, 100},
		{"legacy", featLegacy, 65562, 3000},
		{"mrg_spanning", featMrg, 1536, 9000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordCapture{}
			p := newFlowPair(t, tc.feat, func(c *Config) { c.Capture = rec })
			port := udpEcho(t, "udp4", "127.0.0.1:0")
			p.postRX(32, tc.buf)
			p.start()
			arp := arpRequest(testGuestIP, testGwIP)
			udp := udpFrame(testGuest4, testGw4, 40000, port, bytes.Repeat([]byte{0xa5}, tc.size))
			p.addTX(arp)
			p.addTX(udp)
			p.tx.Send()
			// gratuitous ARP, ARP reply, UDP echo
			waitFor(t, "frames", 3*time.Second, func() bool { return p.stats().RX.Frames.Load() == 3 })
			p.s.StopPair(0)
			_, rxFrames := p.rxRead(t)
			want := append([][]byte{arp, udp}, rxFrames...)
			if len(rec.frames) != len(want) {
				t.Fatalf("captured %d frames, want %d", len(rec.frames), len(want))
			}
			got := append([][]byte(nil), rec.frames...)
			for i, w := range want {
				found := -1
				for j, g := range got {
					if bytes.Equal(g, w) {
						found = j
						break
					}
				}
				if found < 0 {
					t.Fatalf("frame %d (%d bytes) not captured exactly", i, len(w))
				}
				got = append(got[:found], got[found+1:]...)
			}
			for _, pr := range rec.pairs {
				if pr != 0 {
					t.Errorf("captured on pair %d", pr)
				}
			}
			if len(rxFrames) != 3 || len(rxFrames[2]) != header.EthernetMinimumSize+header.IPv4MinimumSize+header.UDPMinimumSize+tc.size {
				t.Errorf("rx frames %d", len(rxFrames))
			}
		})
	}
}

// BenchmarkCaptureRXWriteFrame is BenchmarkRXWriteFrame's mrg_9000 case
// with a capture copying every frame: 0 allocs/op.
func BenchmarkCaptureRXWriteFrame(b *testing.B) {
	cp := &copyCapture{}
	benchRXWriteFrame(b, featMrg, 1536, 9014, cp)
	if cp.frames != b.N*64 {
		b.Fatalf("captured %d, want %d", cp.frames, b.N*64)
	}
}

// BenchmarkCaptureTXBatch is BenchmarkTXBatchDrop with a capture.
func BenchmarkCaptureTXBatch(b *testing.B) {
	p := newTestPair(b, featModern, 256)
	cp := &copyCapture{}
	p.s.cfg.Capture = cp
	l := benchLoop(b, p)
	frame := otherFrame(0x88b5, 1514)
	heads := make([]uint16, txBatchMax)
	for i := range heads {
		heads[i] = p.newTX(frame)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(frame) * txBatchMax))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.tx.repost(heads)
		l.txBatch()
	}
	b.StopTimer()
	if cp.frames != b.N*txBatchMax {
		b.Fatalf("captured %d, want %d", cp.frames, b.N*txBatchMax)
	}
}

package rig

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/frontend"
)

// These tests run the bridge without root: a SOCK_SEQPACKET socketpair
// stands in for the TAP (one frame per read and write, like a TAP fd) and
// echoDevice for the back-end.

const testHdrLen = 12

// echoDevice is a minimal back-end: every TX frame is returned on RX, split
// over several RX buffers with num_buffers when mrg is set. It allocates
// nothing per frame, so benchmarks see the bridge's allocations only.
type echoDevice struct {
	mem              *frontend.Memory
	tx, rx           *frontend.Ring
	mrg              bool
	lastTX, lastRX   uint16
	pool             [][]byte // frame copies, one per TX descriptor
	lens             []int
	head, n          int // queue of pending frames in pool
	stop             chan struct{}
	done             chan struct{}
	waitedForRXDescs atomic.Int64
}

func newEchoDevice(mem *frontend.Memory, tx, rx *frontend.Ring, mrg bool) *echoDevice {
	d := &echoDevice{mem: mem, tx: tx, rx: rx, mrg: mrg, stop: make(chan struct{}), done: make(chan struct{})}
	d.pool = make([][]byte, tx.Size())
	for i := range d.pool {
		d.pool[i] = make([]byte, 1<<16+testHdrLen)
	}
	d.lens = make([]int, tx.Size())
	go d.run()
	return d
}

func (d *echoDevice) close() { close(d.stop); <-d.done }

func (d *echoDevice) run() {
	defer close(d.done)
	fds := []unix.PollFd{{Fd: int32(d.tx.KickFD()), Events: unix.POLLIN}, {Fd: int32(d.rx.KickFD()), Events: unix.POLLIN}}
	var buf [8]byte
	for {
		select {
		case <-d.stop:
			return
		default:
		}
		unix.Poll(fds, 1)
		unix.Read(d.tx.KickFD(), buf[:])
		unix.Read(d.rx.KickFD(), buf[:])
		popped := false
		for d.n < len(d.pool) && d.lastTX != d.tx.AvailIdx() {
			head := d.tx.DeviceAvailEntry(d.lastTX)
			d.lastTX++
			desc := d.tx.ReadDesc(head)
			src, err := d.mem.Slice(desc.Addr, uint64(desc.Len))
			if err != nil {
				panic(err)
			}
			slot := (d.head + d.n) % len(d.pool)
			d.lens[slot] = copy(d.pool[slot], src)
			d.n++
			d.tx.DevicePushUsed(head, 0)
			popped = true
		}
		if popped {
			notify(d.tx.CallFD())
		}
		pushed := false
		for d.n > 0 {
			frame := d.pool[d.head][:d.lens[d.head]]
			avail := int(d.rx.AvailIdx() - d.lastRX)
			if avail == 0 {
				d.waitedForRXDescs.Add(1)
				break
			}
			first := d.rx.ReadDesc(d.rx.DeviceAvailEntry(d.lastRX))
			need := 1
			if d.mrg {
				need = (len(frame) + int(first.Len) - 1) / int(first.Len)
			}
			if avail < need {
				d.waitedForRXDescs.Add(1)
				break
			}
			off := 0
			for i := 0; i < need; i++ {
				head := d.rx.DeviceAvailEntry(d.lastRX)
				d.lastRX++
				desc := d.rx.ReadDesc(head)
				dst, err := d.mem.Slice(desc.Addr, uint64(desc.Len))
				if err != nil {
					panic(err)
				}
				k := copy(dst, frame[off:])
				if i == 0 && d.mrg {
					binary.LittleEndian.PutUint16(dst[10:], uint16(need))
				}
				off += k
				d.rx.DevicePushUsed(head, uint32(k))
			}
			d.head = (d.head + 1) % len(d.pool)
			d.n--
			pushed = true
		}
		if pushed {
			notify(d.rx.CallFD())
		}
	}
}

type bridgeHarness struct {
	br    *bridge
	dev   *echoDevice
	peer  int // the "guest kernel" end of the fake TAP
	stats Stats
}

func newBridgeHarness(tb testing.TB, ring uint16, rxBuf int, mrg bool, slowRX time.Duration) *bridgeHarness {
	tb.Helper()
	return newImpairedHarness(tb, ring, rxBuf, mrg, slowRX, Impairment{})
}

// newImpairedHarness is newBridgeHarness with frames damaged both ways.
func newImpairedHarness(tb testing.TB, ring uint16, rxBuf int, mrg bool, slowRX time.Duration, imp Impairment) *bridgeHarness {
	tb.Helper()
	mem, err := frontend.NewMemory(uint64(ring)*uint64(rxBuf+70000)+1<<20, frontend.LayoutSingle)
	if err != nil {
		tb.Fatal(err)
	}
	rxr, err := frontend.NewRing(mem, 0, ring, false)
	if err != nil {
		tb.Fatal(err)
	}
	txr, err := frontend.NewRing(mem, 1, ring, false)
	if err != nil {
		tb.Fatal(err)
	}
	tx, err := txr.Fixed(70000, false)
	if err != nil {
		tb.Fatal(err)
	}
	rx, err := rxr.Fixed(rxBuf, true)
	if err != nil {
		tb.Fatal(err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		tb.Fatal(err)
	}
	// A TAP never refuses a write (the kernel drops what it cannot queue);
	// a socket would say EAGAIN once the reader lags, so give it room for
	// everything a test has in flight.
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 64<<20); err != nil {
		tb.Fatal(err)
	}
	h := &bridgeHarness{peer: fds[1]}
	h.br, err = newBridge(bridgeConfig{tap: fds[0], hdrLen: testHdrLen, mrg: mrg, tx: []*frontend.FixedRing{tx},
		rx: []*frontend.FixedRing{rx}, slowRX: slowRX, impair: imp, stats: &h.stats, log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	h.dev = newEchoDevice(mem, txr, rxr, mrg)
	h.br.start()
	tb.Cleanup(func() {
		if err := h.br.close(); err != nil {
			tb.Errorf("bridge: %v", err)
		}
		h.dev.close()
		unix.Close(fds[0])
		unix.Close(fds[1])
		rxr.Close()
		txr.Close()
		mem.Close()
	})
	return h
}

// roundTrip sends frames through the bridge and checks each echo: header
// (but num_buffers, which the device sets) and payload byte-exact, in order.
func (h *bridgeHarness) roundTrip(tb testing.TB, frames [][]byte) {
	tb.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	var werr error
	go func() {
		defer wg.Done()
		for _, f := range frames {
			if _, err := retry(func() (int, error) { return unix.Write(h.peer, f) }); err != nil {
				werr = err
				return
			}
		}
	}()
	tv := unix.NsecToTimeval((5 * time.Second).Nanoseconds())
	unix.SetsockoptTimeval(h.peer, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 1<<17)
	for i, f := range frames {
		n, err := retry(func() (int, error) { return unix.Read(h.peer, buf) })
		if err != nil {
			tb.Fatalf("echo %d of %d: %v (bridge: %v)", i, len(frames), err, h.br.failed())
		}
		got := buf[:n]
		if n != len(f) || !bytes.Equal(got[:10], f[:10]) || !bytes.Equal(got[testHdrLen:], f[testHdrLen:]) {
			tb.Fatalf("echo %d: %d bytes, want %d identical (header %x vs %x)", i, n, len(f), got[:min(n, testHdrLen)], f[:testHdrLen])
		}
	}
	wg.Wait()
	if werr != nil {
		tb.Fatal(werr)
	}
}

// waitRXFrames waits up to 2 s for the bridge's RX counter to reach want and
// returns it. The bridge counts a frame after writing it, so the peer can read
// the last one a moment before the counter moves.
func (h *bridgeHarness) waitRXFrames(want uint64) uint64 {
	for deadline := time.Now().Add(2 * time.Second); h.stats.RXFrames.Load() < want && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	return h.stats.RXFrames.Load()
}

// retry repeats a system call the runtime's preemption signal interrupted.
func retry(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err != unix.EINTR {
			return n, err
		}
	}
}

func testFrames(n int) [][]byte {
	g := &stream{s: 7}
	out := make([][]byte, n)
	for i := range out {
		size := testHdrLen + 14 + (i*7919)%9000
		f := make([]byte, size)
		g.fill(f)
		out[i] = f
	}
	return out
}

func TestBridgeEchoMergedBuffers(t *testing.T) {
	h := newBridgeHarness(t, 16, 1024, true, 0) // frames of up to 9 buffers
	frames := testFrames(3000)
	h.roundTrip(t, frames)
	s := &h.stats
	h.waitRXFrames(3000)
	if s.TXFrames.Load() != 3000 || s.RXFrames.Load() != 3000 || s.DeviceErrors.Load() != 0 || s.RXWriteErrors.Load() != 0 {
		t.Fatalf("counters: tx %d rx %d device errors %d write errors %d", s.TXFrames.Load(), s.RXFrames.Load(), s.DeviceErrors.Load(), s.RXWriteErrors.Load())
	}
	t.Logf("tx ring full %d times, device waited for RX descriptors %d times", s.TXRingFull.Load(), h.dev.waitedForRXDescs.Load())
}

func TestBridgeEchoWholeBuffers(t *testing.T) {
	h := newBridgeHarness(t, 64, 9100, false, 0)
	h.roundTrip(t, testFrames(2000))
	if got := h.waitRXFrames(2000); got != 2000 {
		t.Fatalf("rx frames %d, want 2000", got)
	}
}

func TestBridgeSlowReader(t *testing.T) {
	h := newBridgeHarness(t, 16, 9100, false, 2*time.Millisecond)
	start := time.Now()
	h.roundTrip(t, testFrames(200))
	el := time.Since(start)
	// 200 frames through 16 buffers re-posted every 2 ms: at least 12
	// holds, so at least ~24 ms.
	if h.stats.RXHeldBatches.Load() < 12 || el < 20*time.Millisecond {
		t.Fatalf("slow reader: %d holds in %v, want ≥12 holds and ≥20ms", h.stats.RXHeldBatches.Load(), el)
	}
	if h.dev.waitedForRXDescs.Load() == 0 {
		t.Fatalf("the device never waited for RX descriptors")
	}
}

// BenchmarkBridgeEcho: one frame guest → device → guest per op; the bridge's
// loops allocate nothing (the harness neither).
func BenchmarkBridgeEcho(b *testing.B) {
	h := newBridgeHarness(b, 256, 2048, true, 0)
	frame := make([]byte, 1500)
	(&stream{s: 3}).fill(frame)
	buf := make([]byte, 1<<17)
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := retry(func() (int, error) { return unix.Write(h.peer, frame) }); err != nil {
			b.Fatal(err)
		}
		if _, err := retry(func() (int, error) { return unix.Read(h.peer, buf) }); err != nil {
			b.Fatal(err)
		}
	}
}

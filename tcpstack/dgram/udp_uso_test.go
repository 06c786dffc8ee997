package dgram

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// cutFrames undoes USO the way the guest's kernel does (__udp_gso_segment):
// each frame of w becomes its datagrams, every one checked for the headers
// the guest would build from the frame's: the UDP length of the whole with
// the pseudo-header sum over it, adjusted to each datagram's length, must
// make a checksum that verifies. It returns the datagrams' payloads and
// how many frames were USO frames.
func cutFrames(t *testing.T, ft *Table, w *ringSink) (dgrams [][]byte, usoFrames int) {
	t.Helper()
	key := &ft.flows[0].key
	const ipOff = header.EthernetMinimumSize
	udpOff := ipOff + header.IPv4MinimumSize
	if key.v6 {
		udpOff = ipOff + header.IPv6MinimumSize
	}
	for k, f := range w.frames {
		vh, hdr := w.vhs[k], w.hdrs[k]
		u := hdr[udpOff:]
		if l := int(binary.BigEndian.Uint16(u[4:6])); l != udpHdrLen+len(f) {
			t.Fatalf("frame %d: UDP length %d, want %d", k, l, udpHdrLen+len(f))
		}
		if key.v6 {
			if l := int(binary.BigEndian.Uint16(hdr[ipOff+4:])); l != udpHdrLen+len(f) {
				t.Fatalf("frame %d: IPv6 payload length %d, want %d", k, l, udpHdrLen+len(f))
			}
		} else {
			if l := int(binary.BigEndian.Uint16(hdr[ipOff+2:])); l != header.IPv4MinimumSize+udpHdrLen+len(f) {
				t.Fatalf("frame %d: IPv4 total length %d, want %d", k, l, header.IPv4MinimumSize+udpHdrLen+len(f))
			}
			if header.Checksum(hdr[ipOff:udpOff], 0) != 0xffff {
				t.Fatalf("frame %d: IPv4 header checksum does not verify", k)
			}
		}
		if vh.Flags != virtqueue.NetHdrFNeedsCsum || int(vh.CsumStart) != udpOff || vh.CsumOffset != 6 {
			t.Fatalf("frame %d: virtio-net header %+v, want a partial UDP checksum", k, vh)
		}
		seg := max(len(f), 1) // a zero-length datagram is one too
		if vh.GSOType != virtqueue.GSONone {
			if vh.GSOType != virtqueue.GSOUDPL4 || vh.GSOSize == 0 || int(vh.HdrLen) != len(hdr) {
				t.Fatalf("frame %d: virtio-net header %+v, want USO with hdr_len %d", k, vh, len(hdr))
			}
			if seg = int(vh.GSOSize); len(f) <= seg || (len(f)+seg-1)/seg > maxGuestUSOSegments {
				t.Fatalf("frame %d: %d bytes as datagrams of %d", k, len(f), seg)
			}
			usoFrames++
		}
		whole := binary.BigEndian.Uint16(u[4:6])
		for off := 0; off < max(len(f), 1); off += seg {
			d := f[off:min(off+seg, len(f))]
			// The check field as the guest rewrites it for this datagram.
			newLen := uint16(udpHdrLen + len(d))
			check := header.Checksum([]byte{byte(^whole >> 8), byte(^whole), byte(newLen >> 8), byte(newLen)},
				binary.BigEndian.Uint16(u[6:8]))
			if want := header.PseudoHeaderChecksum(header.IPProtocolUDP, key.remoteAddr(), key.guestAddr(), uint32(newLen)); check != want {
				t.Fatalf("frame %d, datagram at %d: pseudo-header sum %#x after the length adjustment, want %#x", k, off, check, want)
			}
			dgrams = append(dgrams, d)
		}
	}
	return dgrams, usoFrames
}

// usoFlowTo is flowTo for a guest that takes USO frames both ways (with
// GUEST_CSUM, which USO needs).
func usoFlowTo(t *testing.T) (*Table, int32, *peer) {
	t.Helper()
	ft, i, c := flowTo(t)
	ft.SetGuestCsum(true)
	ft.SetGuestUSO(true, true)
	return ft, i, c
}

// checkCut checks that the guest's cut of w's frames gives datagrams
// 0..len(sizes)-1 byte for byte, none dropped, and returns how many frames
// were USO frames.
func checkCut(t *testing.T, ft *Table, w *ringSink, sizes []int) (usoFrames int) {
	t.Helper()
	got, uso := cutFrames(t, ft, w)
	if len(got) != len(sizes) {
		t.Fatalf("the guest's cut gives %d datagrams in %d frames, want %d (drops %d)", len(got), len(w.frames), len(sizes),
			ft.st.Proto.UDPDrops[stats.ToGuest][stats.DropNoFit].Load())
	}
	for k, n := range sizes {
		if want := datagram(k, n); !bytes.Equal(got[k], want) {
			t.Fatalf("datagram %d (%d bytes): got %d bytes %x…, want %x…", k, n, len(got[k]), got[k][:min(8, len(got[k]))], want[:min(8, n)])
		}
	}
	return uso
}

// TestUDPReceiveUSO: a guest that takes USO frames (GUEST_CSUM and
// GUEST_USO4) gets what UDP_GRO coalesced as few frames, at most
// maxGuestUSOSegments datagrams each, which the guest's cut gives back
// datagram for datagram, in order between the single ones; where its
// buffers cannot hold a USO frame (one 8 KiB buffer a frame), it gets the
// runs that do not fit datagram by datagram instead of losing them; a guest without
// GUEST_CSUM (which USO needs) or without GUEST_USO4 gets a frame per
// datagram.
func TestUDPReceiveUSO(t *testing.T) {
	for _, tc := range []struct {
		name        string
		sink        ringSink
		csum, uso4  bool
		wantUSO     bool
		wantMaxFrms int // at most this many frames (-1: one per datagram)
	}{
		{"merged_buffers", ringSink{bufSize: 1536, mrg: true}, true, true, true, 30},
		{"big_buffers", ringSink{bufSize: 65562}, true, true, true, 30},
		{"small_buffers_split", ringSink{bufSize: 8192}, true, true, true, 170},
		{"no_guest_csum", ringSink{bufSize: 65562}, false, true, false, -1},
		{"no_guest_uso", ringSink{bufSize: 65562}, true, false, false, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft, i, c := flowTo(t)
			ft.SetGuestCsum(tc.csum)
			ft.SetGuestUSO(tc.uso4, true)
			w := &tc.sink
			w.free = 1 << 20
			var sizes []int
			seq := 0
			single := func(n int) {
				if _, err := c.Write(datagram(seq, n)); err != nil {
					t.Fatal(err)
				}
				seq++
				sizes = append(sizes, n)
			}
			for r := range 3 {
				single(100 + r)
				sizes = append(sizes, sendSegmented(t, c, &seq, 1400, 1400, 1400, 1400, 1400, 1400, 1400, 1400, 700)...)
				sizes = append(sizes, sendSegmented(t, c, &seq, 1000, 1000, 1000)...)
				single(5000)
				// More than a USO frame to the guest carries: 100 of 64 B.
				sizes = append(sizes, sendSegmented(t, c, &seq, 64, slices.Repeat([]int{64}, 100)...)...)
				sizes = append(sizes, sendSegmented(t, c, &seq, 1472, slices.Repeat([]int{1472}, 40)...)...)
				flushFlow(t, ft, i, w)
			}
			if !tc.csum {
				checkFrames(t, ft, w, sizes)
				return
			}
			uso := checkCut(t, ft, w, sizes)
			if ft.rx.coalesced == 0 {
				t.Fatal("the kernel coalesced nothing: UDP_GRO is not on the flow's socket")
			}
			if uso > 0 != tc.wantUSO {
				t.Fatalf("%d USO frames among %d, want some: %v", uso, len(w.frames), tc.wantUSO)
			}
			if tc.sink.bufSize > 8192 && tc.wantUSO && ft.rx.inPlace == 0 {
				t.Fatal("no run went to the guest where it was received, in buffers that hold one: every one was copied")
			}
			if st := ft.st.Proto.UDPUSOFrames[stats.ToGuest].Load(); st != uint64(uso) {
				t.Fatalf("counted %d USO frames, the guest got %d", st, uso)
			}
			if n := ft.st.Proto.UDPDatagrams[stats.ToGuest].Load(); n != uint64(len(sizes)) {
				t.Fatalf("counted %d datagrams to the guest, want %d", n, len(sizes))
			}
			if tc.wantMaxFrms > 0 && len(w.frames) > tc.wantMaxFrms {
				t.Fatalf("%d frames for %d datagrams, want at most %d", len(w.frames), len(sizes), tc.wantMaxFrms)
			}
			if tc.wantMaxFrms < 0 && len(w.frames) != len(sizes) {
				t.Fatalf("%d frames for %d datagrams, want one each", len(w.frames), len(sizes))
			}
			t.Logf("%d datagrams in %d frames (%d USO), %d coalesced receives, %d of them in place", len(sizes), len(w.frames), uso, ft.rx.coalesced, ft.rx.inPlace)
		})
	}
}

// TestUDPReceiveUSOWaitsForBuffers: when the guest's buffers run out with
// USO runs pending, whole (merged buffers: the frame waits until enough
// are posted) or cut up (8 KiB buffers, which a 1472-byte run outgrows:
// the datagrams left wait behind the ones delivered), nothing is lost or
// repeated once the guest refills.
func TestUDPReceiveUSOWaitsForBuffers(t *testing.T) {
	for _, tc := range []struct {
		name string
		sink ringSink
	}{
		{"merged_buffers", ringSink{bufSize: 1536, mrg: true, free: 2}},
		{"small_buffers_split", ringSink{bufSize: 8192, free: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft, i, c := usoFlowTo(t)
			w := &tc.sink
			var sizes []int
			seq := 0
			for range 3 {
				sizes = append(sizes, sendSegmented(t, c, &seq, 1472, slices.Repeat([]int{1472}, 40)...)...)
				sizes = append(sizes, sendSegmented(t, c, &seq, 500, slices.Repeat([]int{500}, 9)...)...)
			}
			for step := 0; step < 1000; step++ {
				w.free += 3 // a trickle of refills
				w.starved = false
				flushFlow(t, ft, i, w)
				if got, _ := cutFrames(t, ft, w); len(got) >= len(sizes) {
					break
				}
			}
			if uso := checkCut(t, ft, w, sizes); uso == 0 {
				t.Fatal("no USO frame")
			}
			t.Logf("%d datagrams in %d frames", len(sizes), len(w.frames))
		})
	}
}

// TestUDPReceiveUSOInPlace: while a flow's receives come coalesced, a
// guest with merged buffers gets each run where it was received (a
// reservation of a whole USO frame, alone in its receive), not copied
// through the overflow region; a datagram that comes alone after them
// gives back the buffers it did not need instead of wasting them, and the
// flow goes back to batches.
func TestUDPReceiveUSOInPlace(t *testing.T) {
	ft, i, c := usoFlowTo(t)
	w := &ringSink{bufSize: 1536, mrg: true, free: 1 << 20}
	var sizes []int
	seq := 0
	for range 10 {
		sizes = append(sizes, sendSegmented(t, c, &seq, 1400, slices.Repeat([]int{1400}, 44)...)...)
		flushFlow(t, ft, i, w)
	}
	for range 3 {
		if _, err := c.Write(datagram(seq, 300)); err != nil {
			t.Fatal(err)
		}
		seq++
		sizes = append(sizes, 300)
	}
	flushFlow(t, ft, i, w)
	if uso := checkCut(t, ft, w, sizes); uso != 10 {
		t.Fatalf("%d USO frames, want 10", uso)
	}
	if ft.rx.inPlace < 9 {
		t.Fatalf("%d of %d runs went where they were received, want at least 9 (all but the first)", ft.rx.inPlace, ft.rx.coalesced)
	}
	if w.wasted != 0 {
		t.Fatalf("%d guest buffers went back empty", w.wasted)
	}
	if f := &ft.flows[i]; f.groSeg != 0 {
		t.Fatalf("groSeg %d after single datagrams", f.groSeg)
	}
}

// TestUDPReceiveUSOSmallRing: a run needs more merged buffers than the
// guest's ring holds (32 of 1536 bytes for 40 datagrams of 1472): once a
// reservation held the whole ring, it goes datagram by datagram rather
// than wait for ever with the flow's other datagrams behind it.
func TestUDPReceiveUSOSmallRing(t *testing.T) {
	ft, i, c := usoFlowTo(t)
	w := &ringSink{bufSize: 1536, mrg: true, size: 32}
	var sizes []int
	seq := 0
	sizes = append(sizes, sendSegmented(t, c, &seq, 1472, slices.Repeat([]int{1472}, 40)...)...)
	sizes = append(sizes, sendSegmented(t, c, &seq, 500, slices.Repeat([]int{500}, 9)...)...)
	for step := 0; step < 20; step++ {
		w.free = 32 // the guest took what it got and posted its whole ring again
		w.starved = false
		flushFlow(t, ft, i, w)
	}
	checkCut(t, ft, w, sizes)
}

// TestUDPReceiveUSODropsCountDatagrams: what is dropped of USO runs counts
// a drop per datagram, under the reason it was dropped for: the flow
// closed with runs pending (flow_closed), the ring was disabled with runs
// pending (ring_disabled), or the guest's ring broke under one
// (queue_broken).
func TestUDPReceiveUSODropsCountDatagrams(t *testing.T) {
	// pending leaves runs of 40 datagrams waiting for guest buffers and
	// returns how many.
	pending := func(t *testing.T) (*Table, int32, *ringSink, int) {
		ft, i, c := usoFlowTo(t)
		w := &ringSink{bufSize: 1536, mrg: true, free: 2}
		seq := 0
		for range 3 {
			sendSegmented(t, c, &seq, 1472, slices.Repeat([]int{1472}, 40)...)
		}
		flushFlow(t, ft, i, w)
		// Each run of 40 (fewer than a USO frame's 64) waits whole, as
		// one entry: dropped, it is 40 drops.
		runs := ft.rx.pEnd - ft.rx.pNext
		if runs == 0 {
			t.Fatal("nothing pending")
		}
		return ft, i, w, runs
	}
	drops := func(ft *Table) (closed, disabled, noFit uint64) {
		d := &ft.st.Proto.UDPDrops[stats.ToGuest]
		return d[stats.DropFlowClosed].Load(), d[stats.DropRingDisabled].Load(), d[stats.DropNoFit].Load()
	}
	t.Run("flow_closed", func(t *testing.T) {
		ft, i, w, runs := pending(t)
		ft.closeFlow(i) // as Expire, makeRoom, Forget and Take do
		if left := ft.rx.pEnd - ft.rx.pNext; left != 0 {
			t.Fatalf("%d runs of a closed flow still wait", left)
		}
		w.free = 1 << 20 // buffers now, too late
		if ft.Flush(ft.now, w) {
			t.Fatal("Flush reports work with no flow open")
		}
		if closed, disabled, noFit := drops(ft); closed != uint64(40*runs) || disabled != 0 || noFit != 0 || len(w.frames) != 0 {
			t.Fatalf("drops flow_closed %d, ring_disabled %d, no_fit %d and %d frames delivered, for %d pending runs of 40 of a closed flow",
				closed, disabled, noFit, len(w.frames), runs)
		}
	})
	t.Run("ring_disabled", func(t *testing.T) {
		// What waits and what is still in the socket: all 120
		// datagrams, counted one by one, coalesced or not.
		ft, i, w, _ := pending(t)
		w.disabled = true
		flushFlow(t, ft, i, w)
		if closed, disabled, noFit := drops(ft); disabled != 3*40 || closed != 0 || noFit != 0 || len(w.frames) != 0 {
			t.Fatalf("drops ring_disabled %d, flow_closed %d, no_fit %d and %d frames delivered, for 3 runs of 40 sent, some pending, to a disabled ring",
				disabled, closed, noFit, len(w.frames))
		}
	})
	t.Run("broken_from_the_start", func(t *testing.T) {
		// The first reservation fails: the run is received whole into
		// the discard buffer, and still counts datagram by datagram.
		ft, i, c := usoFlowTo(t)
		w := &brokenSink{}
		seq := 0
		sendSegmented(t, c, &seq, 1000, slices.Repeat([]int{1000}, 30)...)
		flushFlow(t, ft, i, w)
		if d := ft.st.Proto.UDPDrops[stats.ToGuest][stats.DropQueueBroken].Load(); d != 30 || len(w.frames) != 0 {
			t.Fatalf("%d queue_broken drops counted, %d frames, for a run of 30 on a ring broken from the start", d, len(w.frames))
		}
	})
	t.Run("broken_ring", func(t *testing.T) {
		ft, i, c := usoFlowTo(t)
		w := &breakingSink{ringSink{bufSize: 1536, mrg: true, free: 1 << 20}}
		seq := 0
		sendSegmented(t, c, &seq, 1000, slices.Repeat([]int{1000}, 30)...)
		flushFlow(t, ft, i, w)
		if d := ft.st.Proto.UDPDrops[stats.ToGuest][stats.DropQueueBroken].Load(); d != 30 || len(w.frames) != 0 {
			t.Fatalf("%d queue_broken drops counted, %d frames, for a run of 30 the broken ring could not take (no_fit %d)",
				d, len(w.frames), ft.st.Proto.UDPDrops[stats.ToGuest][stats.DropNoFit].Load())
		}
	})
}

// brokenSink is a ring broken from the start.
type brokenSink struct{ ringSink }

func (s *brokenSink) Reserve(int, int) ([]byte, [][]byte, guestring.Status) {
	return nil, nil, guestring.Broken
}

// breakingSink breaks (guestring.Broken) at any reservation larger than
// one datagram of 1472 bytes.
type breakingSink struct{ ringSink }

func (s *breakingSink) Reserve(hdrLen, maxPayload int) ([]byte, [][]byte, guestring.Status) {
	if maxPayload > 1472 {
		return nil, nil, guestring.Broken
	}
	return s.ringSink.Reserve(hdrLen, maxPayload)
}

// TestUDPReceiveUSOv6: over IPv6 (GUEST_USO6 alone), runs of any segment
// size, up to 30000 bytes, reach the guest as USO frames whose payload
// length, UDP length and pseudo-header sum are the whole frame's, and
// zero-length datagrams between them stay where they were.
func TestUDPReceiveUSOv6(t *testing.T) {
	for _, tc := range []struct {
		name string
		sink ringSink
	}{
		{"big_buffers", ringSink{bufSize: 70000}},
		{"merged_buffers", ringSink{bufSize: 1536, mrg: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft, i, c := flowTo6(t)
			ft.SetGuestCsum(true)
			ft.SetGuestUSO(false, true)
			w := &tc.sink
			w.free = 1 << 20
			var sizes []int
			seq := 0
			zero := func() {
				if _, err := c.Write(nil); err != nil {
					t.Fatal(err)
				}
				seq++
				sizes = append(sizes, 0)
			}
			zero()
			sizes = append(sizes, sendSegmented(t, c, &seq, 1000, slices.Repeat([]int{1000}, 64)...)...)
			zero()
			sizes = append(sizes, sendSegmented(t, c, &seq, 30000, 30000, 29000)...)
			sizes = append(sizes, sendSegmented(t, c, &seq, 8000, 8000, 8000, 8000, 100)...)
			zero()
			flushFlow(t, ft, i, w)
			if uso := checkCut(t, ft, w, sizes); uso != 3 {
				t.Fatalf("%d USO frames, want 3", uso)
			}
		})
	}
}

// flowTo6 is flowTo over IPv6: a flow whose socket is connected to a
// fresh [::1] server, and the server.
func flowTo6(t *testing.T) (*Table, int32, *peer) {
	t.Helper()
	srv, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Fatalf("IPv6 loopback: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	ft := newTestTable(4)
	t.Cleanup(ft.Close)
	port := srv.LocalAddr().(*net.UDPAddr).Port
	key := flowKey{kind: flowUDP, v6: true, guestPort: 40000, remotePort: uint16(port)}
	key.guestIP = netip.MustParseAddr("fd00::2").As16()
	key.remoteIP = netip.MustParseAddr("fd00::1").As16()
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(fd, &unix.SockaddrInet6{Port: port, Addr: [16]byte{15: 1}}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	i, sa := adoptTestFlow(t, ft, &key, fd)
	return ft, i, &peer{srv, &net.UDPAddr{IP: net.IPv6loopback, Port: sa.(*unix.SockaddrInet6).Port}}
}

// usoBenchSink hands out one 70000-byte buffer a reservation, whole (big
// buffers) or cut into 2 KiB pieces (merged buffers), and counts frames.
type usoBenchSink struct {
	buf         [8][70000]byte
	iov         [64][]byte
	next        int
	mrg         bool
	frames, uso uint64
}

func (s *usoBenchSink) Reserve(hdrLen, maxPayload int) ([]byte, [][]byte, guestring.Status) {
	b := s.buf[s.next%len(s.buf)][:]
	s.next++
	rest := b[hdrLen:min(len(b), hdrLen+maxPayload)]
	if !s.mrg {
		s.iov[0] = rest
		return b[:hdrLen], s.iov[:1], guestring.OK
	}
	n := 0
	for ; len(rest) > 0 && n < len(s.iov); n++ {
		c := min(len(rest), 2048)
		s.iov[n], rest = rest[:c], rest[c:]
	}
	return b[:hdrLen], s.iov[:n], guestring.OK
}

func (s *usoBenchSink) Commit(_ int, vh *virtqueue.NetHdr) {
	s.frames++
	if vh.GSOType == virtqueue.GSOUDPL4 {
		s.uso++
	}
}
func (s *usoBenchSink) Abort()          {}
func (s *usoBenchSink) Enabled() bool   { return true }
func (s *usoBenchSink) MoreLater() bool { return false }
func (s *usoBenchSink) Merging() bool   { return s.mrg }

// BenchmarkUDPRecvUSO receives 4 runs of 44 datagrams of 1400 bytes per op
// (UDP_SEGMENT sends over the loopback, not timed) into USO frames, with
// big and with merged guest buffers: 0 allocs/op, 4 USO frames/op.
func BenchmarkUDPRecvUSO(b *testing.B) {
	for _, mrg := range []bool{false, true} {
		name := "big_buffers"
		if mrg {
			name = "merged_buffers"
		}
		b.Run(name, func(b *testing.B) {
			srv := loopbackUDP(b)
			ft := newTestTable(4)
			defer ft.Close()
			ft.SetGuestCsum(true)
			ft.SetGuestUSO(true, true)
			key := v4Key(40000, uint16(srv.LocalAddr().(*net.UDPAddr).Port))
			fd := udpSocketTo(b, srv.LocalAddr().(*net.UDPAddr))
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
			i, _ := ft.adopt(&key, fd)
			sa, _ := unix.Getsockname(fd)
			c := &peer{srv, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*unix.SockaddrInet4).Port}}
			w := &usoBenchSink{mrg: mrg}
			lens := slices.Repeat([]int{1400}, 44)
			op := func() {
				b.StopTimer()
				seq := 0
				for range 4 {
					sendSegmented(b, c, &seq, 1400, lens...)
				}
				b.StartTimer()
				ft.enqueue(i)
				for ft.Flush(ft.now, w) {
				}
			}
			op()
			b.ReportAllocs()
			b.SetBytes(4 * 44 * 1400)
			b.ResetTimer()
			uso0 := w.uso
			for range b.N {
				op()
			}
			b.ReportMetric(float64(w.uso-uso0)/float64(b.N), "uso/op")
		})
	}
}

// TestUDPFlowReceiveBuffer: a UDP flow's socket holds what rmem_max allows
// up to udpRcvBuf, not the 208 KiB default, which a sender's burst of a
// few 64 KiB runs overflows between two wake-ups.
func TestUDPFlowReceiveBuffer(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/core/rmem_max")
	if err != nil {
		t.Fatal(err)
	}
	rmemMax, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	srv := loopbackUDP(t)
	ft := newTestTable(4)
	t.Cleanup(ft.Close)
	key := v4Key(40000, uint16(srv.LocalAddr().(*net.UDPAddr).Port))
	fd := udpSocketTo(t, srv.LocalAddr().(*net.UDPAddr))
	if _, ok := ft.adopt(&key, fd); !ok {
		t.Fatal("adopt")
	}
	got, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel doubles what it grants (bookkeeping overhead).
	if want := 2 * min(udpRcvBuf, rmemMax); got != want {
		t.Fatalf("SO_RCVBUF %d, want %d (rmem_max %d)", got, want, rmemMax)
	}
}

// TestUDPReceiveUSOHintStays: a single datagram larger than a USO run,
// received into a run-sized reservation, does not teach the flow's hint
// the run's size: the small datagrams after it are not each given 64 KiB
// of the guest's buffers, which would come back empty.
func TestUDPReceiveUSOHintStays(t *testing.T) {
	ft, i, c := usoFlowTo(t)
	w := &ringSink{bufSize: 1536, mrg: true, free: 1 << 20}
	seq := 0
	var sizes []int
	for range 3 {
		sizes = append(sizes, sendSegmented(t, c, &seq, 1400, slices.Repeat([]int{1400}, 44)...)...)
		flushFlow(t, ft, i, w)
	}
	send := func(n int) {
		if _, err := c.Write(datagram(seq, n)); err != nil {
			t.Fatal(err)
		}
		seq++
		sizes = append(sizes, n)
	}
	send(65000)
	flushFlow(t, ft, i, w)
	for range 16 {
		send(100)
	}
	flushFlow(t, ft, i, w)
	checkCut(t, ft, w, sizes)
	if w.wasted != 0 {
		t.Fatalf("%d guest buffers came back empty (hint %d)", w.wasted, ft.flows[i].hint)
	}
}

// TestUDPReceiveUSONoEarlySplit: a run that waits for guest buffers is
// not cut up by a loop wake-up that brought no refill (another socket's
// event, a timer): the refill after it takes the run whole.
func TestUDPReceiveUSONoEarlySplit(t *testing.T) {
	ft, i, c := usoFlowTo(t)
	w := &ringSink{bufSize: 1536, mrg: true, free: 20, size: 256}
	seq := 0
	sizes := sendSegmented(t, c, &seq, 1472, slices.Repeat([]int{1472}, 40)...)
	flushFlow(t, ft, i, w) // 20 buffers for a run of 40 datagrams: waits
	flushFlow(t, ft, i, w) // a wake-up without a refill
	w.free += 200
	w.starved = false
	flushFlow(t, ft, i, w)
	if uso := checkCut(t, ft, w, sizes); uso != 1 || len(w.frames) != 1 {
		t.Fatalf("%d frames, %d of them USO: want the run as one", len(w.frames), uso)
	}
}

package dgram

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// sendSegmented sends the datagrams of lens (numbered from *seq) from c as
// one UDP_SEGMENT send of segment size seg, which the flow's UDP_GRO
// socket receives whole.
func sendSegmented(t *testing.T, c *peer, seq *int, seg int, lens ...int) []int {
	t.Helper()
	raw, err := c.c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(seg))
	var buf []byte
	for _, n := range lens {
		buf = append(buf, datagram(*seq, n)...)
		*seq++
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		_, serr = unix.SendmsgN(int(fd), buf, oob, &unix.SockaddrInet4{Port: c.to.Port, Addr: [4]byte{127, 0, 0, 1}}, 0)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	return lens
}

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
	const udpOff = ipOff + header.IPv4MinimumSize
	for k, f := range w.frames {
		vh, hdr := w.vhs[k], w.hdrs[k]
		u := hdr[udpOff:]
		if l := int(binary.BigEndian.Uint16(u[4:6])); l != udpHdrLen+len(f) {
			t.Fatalf("frame %d: UDP length %d, want %d", k, l, udpHdrLen+len(f))
		}
		if l := int(binary.BigEndian.Uint16(hdr[ipOff+2:])); l != header.IPv4MinimumSize+udpHdrLen+len(f) {
			t.Fatalf("frame %d: IPv4 total length %d, want %d", k, l, header.IPv4MinimumSize+udpHdrLen+len(f))
		}
		if header.Checksum(hdr[ipOff:udpOff], 0) != 0xffff {
			t.Fatalf("frame %d: IPv4 header checksum does not verify", k)
		}
		if vh.Flags != virtqueue.NetHdrFNeedsCsum || vh.CsumStart != udpOff || vh.CsumOffset != 6 {
			t.Fatalf("frame %d: virtio-net header %+v, want a partial UDP checksum", k, vh)
		}
		seg := len(f)
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
		for off := 0; off < len(f); off += seg {
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
			if ft.rx.coalesced == 0 {
				t.Fatal("the kernel coalesced nothing: UDP_GRO is not on the flow's socket")
			}
			if uso > 0 != tc.wantUSO {
				t.Fatalf("%d USO frames among %d, want some: %v", uso, len(w.frames), tc.wantUSO)
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
			t.Logf("%d datagrams in %d frames (%d USO), %d coalesced receives", len(sizes), len(w.frames), uso, ft.rx.coalesced)
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
			ft, i, c := flowTo(t)
			ft.SetGuestCsum(true)
			ft.SetGuestUSO(true, true)
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
			if uso == 0 {
				t.Fatal("no USO frame")
			}
			t.Logf("%d datagrams in %d frames (%d USO)", len(sizes), len(w.frames), uso)
		})
	}
}

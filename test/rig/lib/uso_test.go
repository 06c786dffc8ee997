package rig

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/frontend"
)

// usoLoad is one pattern of UDP_SEGMENT (UDP GSO) sends: sends writes of
// perSend datagrams of size bytes each, every write one system call and
// one GSO packet in the sender's kernel.
type usoLoad struct {
	name                 string
	size, perSend, sends int
}

func (l usoLoad) datagrams() int { return l.perSend * l.sends }

var usoLoads = []usoLoad{
	// One 61,600-byte write of 44 datagrams, as a QUIC sender batches.
	{"1400x44", 1400, 44, 46},
	// More datagrams per write than one frame to the guest may carry
	// (usoGuestMaxSegs): what UDP_GRO hands vunet whole must be split.
	{"600x100", 600, 100, 10},
}

const (
	// usoGuestMaxSegs is the most datagrams vunet may put in one
	// GSO_UDP_L4 frame to the guest: what Linux's own UDP GRO coalesces
	// from a NIC (UDP_GRO_CNT_MAX), so any guest kernel takes it.
	usoGuestMaxSegs = 64
	// usoKernelMaxSegs is UDP_MAX_SEGMENTS: the most datagrams a Linux
	// sender's UDP_SEGMENT write, and so its TAP's GSO frame, carries.
	usoKernelMaxSegs = 128
	// usoFrameSlack is what a direction may carry with USO beyond the
	// frames its writes need (usoFramesPerWrite each): ARP, NDP.
	usoFrameSlack = 8
	// usoFrameSegs is the most datagrams one frame (or one UDP_SEGMENT
	// send of vunet's) carries on every path here: vunet cuts at 64.
	usoFrameSegs = 64
	// usoSilence is how long a receiver waits for the rest of a write's
	// datagrams before counting them lost: each write waits for the last
	// one's datagrams, so nothing waits in a queue on the way.
	usoSilence = 5 * time.Second
)

// usoFeatureMask are the three virtio-net USO feature bits.

// The guest's IPv6 configuration for vunet (the flood test's): vunet
// hands out this address and maps the gateway to the host's ::1.
const (
	usoGuest6   = "fd00:213::2/64"
	usoGateway6 = "fd00:213::1"
)

// TestUDPSegmentationOffload: a UDP socket's UDP_SEGMENT writes (many
// datagrams per system call) cross the rig both ways, every datagram
// arrives byte for byte, and the offload shows in the frame counts.
//
//   - USO: vunet offers HOST_USO, so the guest's TAP hands each write over
//     as one GSO_UDP_L4 frame (TUN_F_USO4/6), which vunet sends on in
//     UDP_SEGMENT sends; and GUEST_USO4/6, so what vunet's UDP_GRO socket
//     receives coalesced from a host peer's UDP_SEGMENT write reaches the
//     guest as GSO_UDP_L4 frames of at most 64 datagrams (the guest's
//     socket, without UDP_GRO, still reads them one by one). Each
//     direction moves at most one frame per write (two where vunet cuts at 64), the
//     host peer (UDP_GRO on) reads at most one receive per as many, and
//     every frame vunet hands the guest has the header Linux's
//     udp_send_skb gives a GSO packet (checkUDPFrame), IPv4 and IPv6.
//   - noUSO: the same with the three bits masked, one frame per datagram
//     each way and never a GSO_UDP_L4 frame to the guest.
//   - rigAlone: the rig with no back-end passes the kernel's own USO
//     frames from one TAP to the other, and those frames pass the header
//     check the USO subtest applies to vunet's (the check is right about
//     what Linux builds).
func TestUDPSegmentationOffload(t *testing.T) {
	needRig(t)
	if !TapUSO() {
		// The rig then negotiates no USO (supportedOffloads): there is
		// nothing of vunet's to test on this kernel.
		t.Skip("this kernel's TAP takes no USO (TUN_F_USO4/6 need Linux 6.2): the rig cannot carry USO frames")
	}
	t.Run("USO", func(t *testing.T) {
		u := startUSORig(t, 0)
		if f := u.r.Features(); f&usoFeatureMask != usoFeatureMask {
			t.Errorf("negotiated features %#x: vunet did not offer %s; the frame counts below fail for it",
				f, missingUSO(f))
		}
		u.run(t)
	})
	t.Run("noUSO", func(t *testing.T) {
		u := startUSORig(t, (frontend.DefaultFeatureMask|offloadFeatureMask)&^usoFeatureMask)
		if f := u.r.Features(); f&usoFeatureMask != 0 {
			t.Fatalf("negotiated features %#x: USO bits despite the mask", f)
		}
		u.run(t)
	})
	t.Run("rigAlone", func(t *testing.T) {
		obs := &usoObserver{}
		r := startRig(t, Options{Loopback: true, MTU: 1500, RXObserveHdr: obs.observe})
		peer := r.Gateway().String()
		u := &usoRig{r: r, uso: true, maxSegs: usoKernelMaxSegs, obs: obs,
			listen: map[string]string{"udp4": net.JoinHostPort(peer, "0")},
			peer:   map[string]netip.Addr{"udp4": r.Gateway()}}
		u.run(t)
	})
}

// missingUSO names the USO bits absent from features.
func missingUSO(features uint64) string {
	var names []string
	for _, b := range []struct {
		bit  int
		name string
	}{{frontend.FeatHostUSO, "HOST_USO"}, {frontend.FeatGuestUSO4, "GUEST_USO4"}, {frontend.FeatGuestUSO6, "GUEST_USO6"}} {
		if features&frontend.Bit(b.bit) == 0 {
			names = append(names, "VIRTIO_NET_F_"+b.name)
		}
	}
	return strings.Join(names, ", ")
}

// usoRig is a rig the loads run through, and what they expect of it.
type usoRig struct {
	r *Rig
	// uso: each direction carries several datagrams per frame; else one
	// frame per datagram, and no GSO_UDP_L4 frame to the guest.
	uso bool
	// maxSegs is the most datagrams one frame to the guest may carry.
	maxSegs int
	obs     *usoObserver
	// listen is where host peers listen, per network ("udp4", "udp6");
	// peer is the address the guest reaches them at.
	listen map[string]string
	peer   map[string]netip.Addr
}

// startUSORig starts vunet with IPv4 and IPv6 at MTU 1500 (the MTU UDP
// GSO is for) with the feature mask given (0: every offload), and gives
// the guest its IPv6 address.
func startUSORig(t *testing.T, mask uint64) *usoRig {
	t.Helper()
	obs := &usoObserver{}
	r := startRig(t, Options{MTU: 1500, FeatureMask: mask, RXObserveHdr: obs.observe,
		Backend: append(append([]string{}, DefaultBackend...), "--address", usoGuest6, "--gateway", usoGateway6)})
	for _, args := range [][]string{
		// No duplicate address detection: the address is usable at once.
		{"-6", "addr", "add", usoGuest6, "dev", tapName, "nodad"},
		// Replace: vunet's router advertisement may have set one already.
		{"-6", "route", "replace", "default", "via", usoGateway6, "dev", tapName},
	} {
		if err := ip(append([]string{"-n", r.GuestNetns()}, args...)...); err != nil {
			t.Fatalf("guest IPv6: %v", err)
		}
	}
	return &usoRig{r: r, uso: mask == 0, maxSegs: usoGuestMaxSegs, obs: obs,
		listen: map[string]string{"udp4": "127.0.0.1:0", "udp6": "[::1]:0"},
		peer:   map[string]netip.Addr{"udp4": r.Gateway(), "udp6": netip.MustParseAddr(usoGateway6)}}
}

// run sends every load both ways over every network the rig has.
func (u *usoRig) run(t *testing.T) {
	for _, dir := range []struct {
		name   string
		toHost bool
	}{{"guest-to-host", true}, {"host-to-guest", false}} {
		t.Run(dir.name, func(t *testing.T) {
			for _, network := range []string{"udp4", "udp6"} {
				if _, ok := u.listen[network]; !ok {
					continue
				}
				t.Run(network, func(t *testing.T) {
					for _, l := range usoLoads {
						t.Run(l.name, func(t *testing.T) { u.load(t, dir.toHost, network, l) })
					}
				})
			}
		})
	}
	healthy(t, u.r)
}

// load sends l one way between a guest socket and a host peer and checks
// what arrived and how many frames carried it.
func (u *usoRig) load(t *testing.T, toHost bool, network string, l usoLoad) {
	peer, err := u.r.HostListenPacket(network, u.listen[network])
	if err != nil {
		t.Fatalf("host peer: %v", err)
	}
	defer peer.Close()
	guest, err := u.r.GuestListenPacket(network, ":0")
	if err != nil {
		t.Fatalf("guest socket: %v", err)
	}
	defer guest.Close()
	// Room for every datagram of a write at each receiver, whatever the
	// kernel's per-datagram overhead.
	for _, c := range []net.PacketConn{peer, guest} {
		if err := setSockopt(c, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20); err != nil {
			t.Fatal(err)
		}
	}
	peerAddr := &net.UDPAddr{IP: u.peer[network].AsSlice(), Port: peer.LocalAddr().(*net.UDPAddr).Port}
	// The host peer takes what the host kernel coalesced (UDP_GRO): a
	// UDP_SEGMENT send on the loopback reaches it as one receive, so the
	// receives count vunet's sends.
	if err := setSockopt(peer, unix.SOL_UDP, unix.UDP_GRO, 1); err != nil {
		t.Fatal(err)
	}
	p := usoPath{tx: guest.(*net.UDPConn), rx: peer.(*net.UDPConn), dst: peerAddr}
	if !toHost {
		// The guest opens the flow, as a client would; the peer answers
		// where the datagram came from (vunet's socket for the flow).
		if _, err := guest.WriteTo([]byte("open"), peerAddr); err != nil {
			t.Fatalf("guest's first datagram: %v", err)
		}
		buf := make([]byte, 64)
		peer.SetReadDeadline(time.Now().Add(usoSilence))
		_, from, err := peer.ReadFrom(buf)
		if err != nil {
			t.Fatalf("host peer waiting for the guest's first datagram: %v", err)
		}
		p = usoPath{tx: peer.(*net.UDPConn), rx: guest.(*net.UDPConn), dst: from, from: peerAddr}
		u.obs.watch(uint16(guest.LocalAddr().(*net.UDPAddr).Port), u.maxSegs)
	}

	s := u.r.Stats()
	tx0, rx0 := s.TXFrames.Load(), s.RXFrames.Load()
	res := sendUSO(t, p, l)
	// Frames from the guest are counted as the rig hands them to the
	// back-end, so before the host peer can read them. Frames to the
	// guest are counted by the rig after the TAP write returns, which may
	// be after the guest read them: the observer's count, taken before
	// the write and only of the flow's frames, is the one to judge.
	frames, what := s.TXFrames.Load()-tx0, "from the guest (the rig's TX frames)"
	if !toHost {
		frames, what = uint64(u.obs.result().frames), "to the guest's port"
	}
	n := l.datagrams()
	t.Logf("%d datagrams of %d bytes in %d UDP_SEGMENT writes: %d arrived, %d frames %s (rig: %d TX, %d RX frames)",
		n, l.size, l.sends, res.got, frames, what, s.TXFrames.Load()-tx0, s.RXFrames.Load()-rx0)
	if res.got != n {
		t.Errorf("%d of %d datagrams arrived (%d duplicates, %d wrong): the writes were paced, none may be lost", res.got, n, res.dup, res.bad)
	}
	// With USO a write is one frame, or two where vunet cuts it at 64.
	maxFrames := l.sends*((l.perSend+usoFrameSegs-1)/usoFrameSegs) + usoFrameSlack
	switch {
	case u.uso && frames > uint64(maxFrames):
		t.Errorf("%d frames %s for %d datagrams in %d writes, want ≤ %d: the datagrams were not carried as whole USO (GSO_UDP_L4) frames",
			frames, what, n, l.sends, maxFrames)
	case !u.uso && frames < uint64(n):
		t.Errorf("%d frames %s for %d datagrams without USO, want ≥ %d: one frame per datagram", frames, what, n, n)
	}
	if toHost {
		t.Logf("the host peer read them in %d receives (UDP_GRO on)", res.reads)
		if u.uso && res.reads > maxFrames {
			t.Errorf("the host peer (UDP_GRO on) needed %d receives for %d datagrams, want ≤ %d: the guest's USO frames did not leave vunet as whole UDP_SEGMENT sends",
				res.reads, n, maxFrames)
		}
		return
	}
	o := u.obs.result()
	t.Logf("%d of the frames to the guest's port were GSO_UDP_L4; the largest well-formed one carried %d datagrams", o.gso, o.segsMax)
	if want := min(l.perSend, u.maxSegs); u.uso && o.segsMax < want {
		t.Errorf("the largest USO frame to the guest carried %d datagrams, want %d: runs were cut smaller than they came", o.segsMax, want)
	}
	for _, f := range o.faults {
		t.Errorf("frame to the guest: %s", f)
	}
	if u.uso && o.gso == 0 {
		t.Errorf("no GSO_UDP_L4 frame to the guest among %d", o.frames)
	}
	if !u.uso && o.gso != 0 {
		t.Errorf("%d GSO_UDP_L4 frames to the guest without GUEST_USO4/6 negotiated", o.gso)
	}
}

// usoPath is one direction of a load: the sender's socket, the
// receiver's (with UDP_GRO or without), where the sender sends and (if
// set) the source the receiver must see.
type usoPath struct {
	tx, rx *net.UDPConn
	dst    net.Addr
	from   *net.UDPAddr
}

// usoResult counts what the receiver got: datagrams, in how many
// receives, and those that came twice or wrong.
type usoResult struct {
	got, reads, dup, bad int
}

// sendUSO sends load l over p in UDP_SEGMENT writes, each after the last
// one's datagrams arrived (or usoSilence passed), and checks every
// datagram received: its size, its sequence number, its bytes, its
// source. A receive the kernel coalesced (UDP_GRO) is cut at the segment
// size it reports. Faults are reported (the first few), and counted.
func sendUSO(t *testing.T, p usoPath, l usoLoad) usoResult {
	t.Helper()
	if err := setSockopt(p.tx, unix.SOL_UDP, unix.UDP_SEGMENT, l.size); err != nil {
		t.Fatal(err)
	}
	n := l.datagrams()
	seen := make([]bool, n)
	var res usoResult
	faults := 0
	fault := func(format string, args ...any) {
		res.bad++
		if faults++; faults <= 5 {
			t.Errorf(format, args...)
		}
	}
	out := make([]byte, l.perSend*l.size)
	in := make([]byte, 65536)
	oob := make([]byte, unix.CmsgSpace(4))
	want := make([]byte, l.size)
	check := func(d []byte) {
		if len(d) != l.size {
			fault("datagram of %d bytes, want %d (datagrams merged or cut)", len(d), l.size)
			return
		}
		seq := binary.BigEndian.Uint32(d)
		if seq >= uint32(n) {
			fault("datagram with sequence number %d, sent %d", seq, n)
			return
		}
		usoDatagram(want, seq)
		switch {
		case !bytes.Equal(d, want):
			fault("datagram %d: bytes differ from what was sent", seq)
		case seen[seq]:
			res.dup++
			fault("datagram %d arrived twice", seq)
		default:
			seen[seq] = true
			res.got++
		}
	}
	for w := 0; w < l.sends; w++ {
		want := res.got + l.perSend // what this write adds
		for i := 0; i < l.perSend; i++ {
			usoDatagram(out[i*l.size:(i+1)*l.size], uint32(w*l.perSend+i))
		}
		if _, err := p.tx.WriteTo(out, p.dst); err != nil {
			if w == 0 && errors.Is(err, unix.EINVAL) && l.perSend > 64 {
				// The sender's kernel, not the rig or vunet: before
				// UDP_MAX_SEGMENTS became 128, a write carried 64.
				t.Skipf("this kernel refuses %d datagrams in one UDP_SEGMENT write (UDP_MAX_SEGMENTS 64): %v", l.perSend, err)
			}
			t.Fatalf("write %d (%d datagrams of %d bytes, UDP_SEGMENT): %v", w, l.perSend, l.size, err)
		}
		silent := false
		for res.got < want {
			p.rx.SetReadDeadline(time.Now().Add(usoSilence))
			k, oobn, _, from, err := p.rx.ReadMsgUDP(in, oob)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				silent = true // counted as missing at the end
				break
			}
			if err != nil {
				t.Fatalf("receive after write %d: %v", w, err)
			}
			res.reads++
			if p.from != nil && (!from.IP.Equal(p.from.IP) || from.Port != p.from.Port) {
				fault("datagram from %v, want %v", from, p.from)
				continue
			}
			seg, err := groSegment(oob[:oobn])
			if err != nil {
				fault("receive after write %d: %v", w, err)
				continue
			}
			if seg == 0 {
				seg = k // one datagram
			}
			for off := 0; off < k; off += seg {
				check(in[off:min(off+seg, k)])
			}
		}
		if silent {
			break // one silence fails the subtest; more writes would only wait too
		}
	}
	return res
}

// groSegment returns the segment size of a coalesced receive (the
// UDP_GRO control message), 0 if the receive is one datagram.
func groSegment(oob []byte) (int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, fmt.Errorf("control messages: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_UDP && m.Header.Type == unix.UDP_GRO && len(m.Data) >= 4 {
			return int(binary.NativeEndian.Uint32(m.Data)), nil
		}
	}
	return 0, nil
}

// usoDatagram fills b with datagram seq: its sequence number, then bytes
// that depend on seq and their position only, so a datagram cut short,
// shifted or glued to another is caught.
func usoDatagram(b []byte, seq uint32) {
	binary.BigEndian.PutUint32(b, seq)
	g := &stream{s: uint64(seq)*0x9e3779b97f4a7c15 | 1}
	g.fill(b[4:])
}

// setSockopt sets an integer socket option on a datagram socket.
func setSockopt(c net.PacketConn, level, opt, v int) error {
	sc, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := sc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, v) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setsockopt(%d, %d, %d) on %v: %w", level, opt, v, c.LocalAddr(), serr)
	}
	return nil
}

// usoObserver checks the frames the guest is handed for one UDP flow (to
// its port), on the rig's RX threads (Options.RXObserveHdr).
type usoObserver struct {
	mu      sync.Mutex
	port    uint16
	maxSegs int
	res     usoObserved
}

// usoObserved is what an observer saw: frames to the port, the
// GSO_UDP_L4 ones, the most datagrams a frame that passed checkUDPFrame
// carried, and the first header faults.
type usoObserved struct {
	frames, gso, segsMax int
	faults               []string
}

// watch starts over for frames to port, of at most maxSegs datagrams.
func (o *usoObserver) watch(port uint16, maxSegs int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.port, o.maxSegs, o.res = port, maxSegs, usoObserved{}
}

func (o *usoObserver) result() usoObserved {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.res
}

func (o *usoObserver) observe(_ int, h frontend.NetHdr, f []byte) {
	u, ok := parseUDPFrame(f)
	o.mu.Lock()
	defer o.mu.Unlock()
	if !ok || o.port == 0 || u.dport != o.port {
		return
	}
	o.res.frames++
	if h.GSOType == frontend.GSOUDPL4 {
		o.res.gso++
	}
	segs, err := checkUDPFrame(h, f, o.maxSegs)
	if err != nil {
		if len(o.res.faults) < 5 {
			o.res.faults = append(o.res.faults, err.Error())
		}
		return
	}
	o.res.segsMax = max(o.res.segsMax, segs)
}

// udpFrame locates the UDP header of an Ethernet frame.
type udpFrame struct {
	l4off  int    // offset of the UDP header in the frame
	l4len  int    // UDP header and payload, by the IP header
	ipEnd  int    // end of the IP packet, by the IP header
	pseudo uint32 // the pseudo-header's addresses and protocol, summed
	dport  uint16
}

// parseUDPFrame reads a UDP frame over IPv4 (not a fragment) or IPv6 (no
// extension header).
func parseUDPFrame(f []byte) (udpFrame, bool) {
	var u udpFrame
	if len(f) < 14 {
		return u, false
	}
	ip := f[14:]
	switch binary.BigEndian.Uint16(f[12:14]) {
	case 0x0800:
		if len(ip) < 20 || ip[0]>>4 != 4 || ip[9] != 17 || binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 {
			return u, false
		}
		ihl, tot := int(ip[0]&0xf)*4, int(binary.BigEndian.Uint16(ip[2:4]))
		u.l4off, u.l4len, u.ipEnd = 14+ihl, tot-ihl, 14+tot
		u.pseudo = sum16(ip[12:20]) + 17
	case 0x86dd:
		if len(ip) < 40 || ip[0]>>4 != 6 || ip[6] != 17 {
			return u, false
		}
		u.l4off, u.l4len = 14+40, int(binary.BigEndian.Uint16(ip[4:6]))
		u.ipEnd = u.l4off + u.l4len
		u.pseudo = sum16(ip[8:40]) + 17
	default:
		return u, false
	}
	if u.l4len < 8 || len(f) < u.l4off+8 {
		return u, false
	}
	u.dport = binary.BigEndian.Uint16(f[u.l4off+2:])
	return u, true
}

// checkUDPFrame checks a UDP frame the guest is handed with its
// virtio-net header and returns how many datagrams it carries. A
// GSO_UDP_L4 frame must be what Linux's udp_send_skb makes of a
// UDP_SEGMENT write (and what a guest's kernel then segments): NEEDS_CSUM
// with csum_start at the UDP header and csum_offset 6; IP and UDP lengths
// of the whole frame; in the checksum field the pseudo-header sum over
// that whole UDP length, not complemented; gso_size the datagrams' payload
// size, with more than one datagram's payload (Linux's __udp_gso_segment
// refuses a frame of one) and at most maxSegs datagrams.
func checkUDPFrame(h frontend.NetHdr, f []byte, maxSegs int) (int, error) {
	u, ok := parseUDPFrame(f)
	if !ok {
		return 0, errors.New("not a UDP frame")
	}
	udp := f[u.l4off:]
	ulen := int(binary.BigEndian.Uint16(udp[4:6]))
	switch {
	case u.ipEnd > len(f):
		return 0, fmt.Errorf("IP length says %d bytes, the frame has %d", u.ipEnd, len(f))
	case ulen != u.l4len:
		return 0, fmt.Errorf("UDP length %d, IP payload %d", ulen, u.l4len)
	}
	if h.GSOType == frontend.GSONone {
		return 1, nil
	}
	if h.GSOType != frontend.GSOUDPL4 {
		return 0, fmt.Errorf("gso_type %#x on a UDP frame, want %d (GSO_UDP_L4) or none", h.GSOType, frontend.GSOUDPL4)
	}
	payload := ulen - 8
	switch {
	case u.ipEnd != len(f):
		return 0, fmt.Errorf("GSO_UDP_L4 frame of %d bytes, its IP length says %d", len(f), u.ipEnd)
	case h.Flags&frontend.NetHdrFNeedsCsum == 0:
		return 0, fmt.Errorf("GSO_UDP_L4 frame without NEEDS_CSUM (flags %#x)", h.Flags)
	case int(h.CsumStart) != u.l4off || h.CsumOffset != 6:
		return 0, fmt.Errorf("GSO_UDP_L4 frame: csum_start %d, csum_offset %d, want %d, 6 (the UDP checksum)", h.CsumStart, h.CsumOffset, u.l4off)
	case h.GSOSize == 0 || payload <= int(h.GSOSize):
		return 0, fmt.Errorf("GSO_UDP_L4 frame: gso_size %d for %d bytes of payload, want more than one datagram's", h.GSOSize, payload)
	}
	segs := (payload + int(h.GSOSize) - 1) / int(h.GSOSize)
	if segs > maxSegs {
		return 0, fmt.Errorf("GSO_UDP_L4 frame of %d datagrams (gso_size %d, %d bytes), want at most %d", segs, h.GSOSize, payload, maxSegs)
	}
	want := ^csumFold(u.pseudo + uint32(ulen))
	if got := binary.BigEndian.Uint16(udp[6:8]); got != want {
		return 0, fmt.Errorf("GSO_UDP_L4 frame: UDP checksum field %#04x, want %#04x (the pseudo-header sum over UDP length %d)", got, want, ulen)
	}
	return segs, nil
}

// TestCheckUDPFrame: the header check of TestUDPSegmentationOffload takes
// a USO frame built the way Linux's udp_send_skb builds one, IPv4 and
// IPv6, and refuses each of its fields gone wrong.
func TestCheckUDPFrame(t *testing.T) {
	const gso, segs = 1400, 3
	for _, c := range []struct {
		name string
		make func(byte, int) ([]byte, []byte, []byte, []byte)
	}{{"udp4", frameV4}, {"udp6", frameV6}} {
		// good returns a 3-datagram frame (the last one short) with its
		// header: NEEDS_CSUM, the pseudo-header sum in the checksum field.
		// addrs is the pseudo-header's addresses and protocol, summed.
		good := func() (h frontend.NetHdr, f []byte, addrs uint32) {
			buf, src, dst, l4 := c.make(17, gso*(segs-1)+100)
			binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
			addrs = sum16(src) + sum16(dst) + 17
			binary.BigEndian.PutUint16(l4[6:], ^csumFold(addrs+uint32(len(l4))))
			f = buf[testHdrLen:]
			h = frontend.NetHdr{Flags: frontend.NetHdrFNeedsCsum, GSOType: frontend.GSOUDPL4, GSOSize: gso,
				CsumStart: uint16(len(f) - len(l4)), CsumOffset: 6}
			return h, f, addrs
		}
		t.Run(c.name, func(t *testing.T) {
			h, f, _ := good()
			if n, err := checkUDPFrame(h, f, segs); err != nil || n != segs {
				t.Fatalf("a frame as Linux builds it: %d datagrams, %v; want %d, nil", n, err, segs)
			}
			h.GSOType, h.Flags = frontend.GSONone, 0
			if n, err := checkUDPFrame(h, f, segs); err != nil || n != 1 {
				t.Fatalf("the same without GSO: %d datagrams, %v; want 1, nil", n, err)
			}
			for _, m := range []struct {
				name  string
				spoil func(h *frontend.NetHdr, f []byte, addrs uint32) []byte
			}{
				{"UFO, not USO", func(h *frontend.NetHdr, f []byte, _ uint32) []byte { h.GSOType = frontend.GSOUDP; return f }},
				{"no NEEDS_CSUM", func(h *frontend.NetHdr, f []byte, _ uint32) []byte { h.Flags = 0; return f }},
				{"csum_start at the IP header", func(h *frontend.NetHdr, f []byte, _ uint32) []byte { h.CsumStart = 14; return f }},
				{"csum_offset of TCP", func(h *frontend.NetHdr, f []byte, _ uint32) []byte { h.CsumOffset = 16; return f }},
				{"gso_size of the whole payload", func(h *frontend.NetHdr, f []byte, _ uint32) []byte { h.GSOSize = gso*(segs-1) + 100; return f }},
				{"no gso_size", func(h *frontend.NetHdr, f []byte, _ uint32) []byte { h.GSOSize = 0; return f }},
				{"more datagrams than allowed", func(h *frontend.NetHdr, f []byte, _ uint32) []byte { h.GSOSize = 100; return f }},
				{"checksum field complemented", func(h *frontend.NetHdr, f []byte, _ uint32) []byte {
					c := f[h.CsumStart+6:]
					binary.BigEndian.PutUint16(c, ^binary.BigEndian.Uint16(c))
					return f
				}},
				{"checksum over one datagram's length", func(h *frontend.NetHdr, f []byte, addrs uint32) []byte {
					binary.BigEndian.PutUint16(f[h.CsumStart+6:], ^csumFold(addrs+8+gso))
					return f
				}},
				{"checksum complete, not partial", func(h *frontend.NetHdr, f []byte, addrs uint32) []byte {
					l4 := f[h.CsumStart:]
					binary.BigEndian.PutUint16(l4[6:], 0)
					b := l4
					if len(b)%2 == 1 {
						b = append(append([]byte(nil), b...), 0)
					}
					binary.BigEndian.PutUint16(l4[6:], csumFold(addrs+uint32(len(l4))+sum16(b)))
					return f
				}},
				{"UDP length of one datagram", func(h *frontend.NetHdr, f []byte, _ uint32) []byte {
					binary.BigEndian.PutUint16(f[h.CsumStart+4:], 8+gso)
					return f
				}},
				{"frame longer than its IP length", func(h *frontend.NetHdr, f []byte, _ uint32) []byte { return append(f, 0, 0) }},
			} {
				h, f, addrs := good()
				f = m.spoil(&h, f, addrs)
				if n, err := checkUDPFrame(h, f, segs); err == nil {
					t.Errorf("%s: accepted (%d datagrams)", m.name, n)
				} else {
					t.Logf("%s: %v", m.name, err)
				}
			}
		})
	}
}

// TestTapUSOProbe: on a kernel of 6.2 or later the probe finds USO in the
// TAP, so that TestUDPSegmentationOffload runs rather than skips there (an
// older kernel may have it backported).
func TestTapUSOProbe(t *testing.T) {
	needRig(t)
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	rel := unix.ByteSliceToString(uts.Release[:])
	var major, minor int
	if _, err := fmt.Sscanf(rel, "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", rel, err)
	}
	if major > 6 || major == 6 && minor >= 2 {
		if !TapUSO() {
			t.Fatalf("TapUSO() = false on Linux %s, which has TUN_F_USO4/6", rel)
		}
	}
}

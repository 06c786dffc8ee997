package tcpstack

import (
	"bytes"
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/virtqueue"
)

// FuzzUDPFromGuestUSO sends one guest UDP frame per input through the TX
// path of a flow to a loopback peer, with any GSO type, gso_size and
// payload length in its virtio-net header and any error in its UDP length
// field: a USO frame (HOST_USO) is the guest's say about how many
// datagrams a frame holds. The peer must get a prefix of the payload, in
// order, never a byte more, cut at gso_size where the header asks for USO
// (no datagram longer than that, all but the last that long); what it does
// not get is a counted drop; the chain always comes back used.
func FuzzUDPFromGuestUSO(f *testing.F) {
	f.Add(uint8(virtqueue.GSOUDPL4), uint16(1400), uint16(44*1400), int16(0))
	f.Add(uint8(virtqueue.GSOUDPL4), uint16(0), uint16(3000), int16(0))
	f.Add(uint8(virtqueue.GSOUDPL4), uint16(1), uint16(200), int16(0))
	f.Add(uint8(virtqueue.GSOUDPL4), uint16(7), uint16(1000), int16(0))
	f.Add(uint8(virtqueue.GSOUDPL4|virtqueue.GSOECN), uint16(500), uint16(5000), int16(-7))
	f.Add(uint8(virtqueue.GSONone), uint16(0), uint16(100), int16(-50))
	f.Add(uint8(virtqueue.GSOTCPv4), uint16(1000), uint16(4000), int16(9))
	f.Add(uint8(virtqueue.GSOTCPv4), uint16(1000), uint16(4000), int16(0))
	f.Add(uint8(virtqueue.GSOUDPL4), uint16(65000), uint16(0), int16(0))
	p := newFlowPair(f, featModern, nil)
	l, remote, port := benchUDPFlow(f, p)
	if unix.SetsockoptInt(remote, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) != nil {
		_ = unix.SetsockoptInt(remote, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	st := p.stats()
	drops := func() (n uint64) {
		for r := range st.Proto.UDPDrops[stats.FromGuest] {
			n += st.Proto.UDPDrops[stats.FromGuest][r].Load()
		}
		return n
	}
	buf := make([]byte, 1<<16)
	f.Fuzz(func(t *testing.T, gsoType uint8, gsoSize, n uint16, ulenDelta int16) {
		n = min(n, 0xffff-header.IPv4MinimumSize-header.UDPMinimumSize)
		payload := make([]byte, n)
		for k := range payload {
			payload[k] = byte(k*7 + k>>8)
		}
		frame := udpFrame(testGuest4, testGw4, 40000, port, payload)
		ulen := uint16(int(header.UDPMinimumSize) + int(n) + int(ulenDelta))
		udpOff := header.EthernetMinimumSize + header.IPv4MinimumSize
		binary.BigEndian.PutUint16(frame[udpOff+4:], ulen)
		vh := virtqueue.NetHdr{Flags: virtqueue.NetHdrFNeedsCsum, GSOType: gsoType, GSOSize: gsoSize,
			HdrLen: uint16(udpOff + header.UDPMinimumSize), CsumStart: uint16(udpOff), CsumOffset: 6}
		chain := make([]byte, p.hdrLen+len(frame))
		vh.Encode(chain[:p.hdrLen])
		copy(chain[p.hdrLen:], frame)
		used := p.tx.UsedIdx()
		drops0 := drops()
		uso0 := st.Proto.UDPUSOFrames[stats.FromGuest].Load()
		p.tx.setChainAt(testScratchBase, chain, nil) // the same memory each time
		l.txBatch()
		if p.tx.UsedIdx() != used+1 {
			t.Fatalf("the chain did not come back used")
		}
		var got []byte
		var sizes []int
		for {
			m, _, err := unix.Recvfrom(remote, buf, unix.MSG_DONTWAIT)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				break
			}
			got = append(got, buf[:m]...)
			sizes = append(sizes, m)
		}
		if !bytes.Equal(got, payload[:min(len(got), len(payload))]) || len(got) > len(payload) {
			t.Fatalf("the peer got %d bytes in %d datagrams that are not a prefix of the %d sent", len(got), len(sizes), n)
		}
		if gsoType&0x7f == virtqueue.GSOUDPL4 && gsoSize > 0 {
			for k, m := range sizes {
				if m > int(gsoSize) || (k < len(sizes)-1 && m != int(gsoSize)) {
					t.Fatalf("datagram %d of %d is %d bytes, gso_size %d", k, len(sizes), m, gsoSize)
				}
			}
		} else if len(sizes) > 1 {
			t.Fatalf("a frame with GSO type %#x (gso_size %d) went out as %d datagrams", gsoType, gsoSize, len(sizes))
		}
		dropped := drops() - drops0
		if len(sizes) == 0 && dropped == 0 {
			t.Fatalf("%d bytes (UDP length %d) neither reached the peer nor were counted dropped", n, ulen)
		}
		if want := int(ulen) - header.UDPMinimumSize; dropped == 0 && len(got) != want {
			t.Fatalf("the peer got %d bytes of a datagram whose UDP length says %d", len(got), want)
		}
		// A frame the guest cut into several datagrams counts as a USO frame.
		if uso := st.Proto.UDPUSOFrames[stats.FromGuest].Load() - uso0; uso != 0 && uso != 1 || (dropped == 0 && len(sizes) > 1) != (uso == 1) {
			t.Fatalf("%d USO frames counted for a frame that went out as %d datagrams (%d dropped)", uso, len(sizes), dropped)
		}
	})
}

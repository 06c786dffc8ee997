package tcp

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/internal/guestframe"
)

// gatherFuzzStream is the guest's byte stream in FuzzTCPGuestBatch: every
// segment carries the stream's bytes at its sequence offset, so whatever
// the frames' order, overlaps and batching, the peer must read a prefix
// of it.
var gatherFuzzStream = guestframe.Pattern(1 << 16)

// FuzzTCPGuestBatch drives an established connection with a real loopback
// peer through TX batches of guest data segments the fuzzer arranges:
// sequence offsets (in order, repeated, overlapping, past a hole), sizes,
// PSH and FIN, where each frame's memory splits into two iovecs and where
// batches end. In-order data joins a run written at the batch's end
// (send_gather.go), from memory the harness poisons once the batch is
// over. The peer must read a prefix of the guest's stream, and at least
// every byte the table acknowledged to the guest (a local peer's ACKs
// mean "written": DESIGN invariant 1).
//
// Each input is 5-byte records: seq offset (uint16, bytes into the
// stream), length (uint16, mod 3000), and a control byte: bit 0 PSH, bit 1
// FIN, bit 2 ends the batch after this frame, the high 5 bits where the
// frame's memory splits (in 64-byte steps past the headers).
func FuzzTCPGuestBatch(f *testing.F) {
	rec := func(off, n uint16, ctl byte) []byte {
		var b [5]byte
		binary.BigEndian.PutUint16(b[0:], off)
		binary.BigEndian.PutUint16(b[2:], n)
		b[4] = ctl
		return b[:]
	}
	cat := func(rs ...[]byte) []byte { return bytes.Join(rs, nil) }
	f.Add(cat(rec(0, 1000, 0), rec(1000, 1000, 1<<3), rec(2000, 1000, 4)))                // one run
	f.Add(cat(rec(0, 1000, 0), rec(500, 1000, 0), rec(1500, 700, 2)))                     // overlap, FIN
	f.Add(cat(rec(0, 1000, 0), rec(3000, 1000, 0), rec(1000, 2000, 1), rec(4000, 10, 4))) // a hole filled
	f.Add(cat(rec(0, 1460, 0x28), rec(1460, 1460, 0x2c), rec(1460, 1460, 0), rec(2920, 1, 0)))
	f.Add(cat(rec(0, 0, 0), rec(0, 2999, 0xf8), rec(2999, 2999, 4), rec(5998, 2999, 0)))

	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 5*64 {
			return
		}
		h := tcpNewHarness(t, Config{})
		opts := tcpMss1400ws7
		opts.SACKPermitted = len(in)%2 == 0
		peer := h.establish(h.listen(), opts)
		h.flush()
		base := h.seq
		maxAck := base
		noteAcks := func(ss []tcpSeg) {
			for _, s := range ss {
				if s.flags&header.TCPFlagACK != 0 && seqGT(s.ack, maxAck) {
					maxAck = s.ack
				}
			}
		}
		fin := false
		h.batch = true
		for ; len(in) >= 5; in = in[5:] {
			off := uint32(binary.BigEndian.Uint16(in[0:]))
			n := int(binary.BigEndian.Uint16(in[2:]) % 3000)
			ctl := in[4]
			if int(off)+n > len(gatherFuzzStream) {
				n = len(gatherFuzzStream) - int(off)
			}
			fl := header.TCPFlagACK
			if ctl&1 != 0 {
				fl |= header.TCPFlagPSH
			}
			if ctl&2 != 0 {
				fl |= header.TCPFlagFIN
				fin = true
			}
			b := h.frame(fl, base+off, h.ack, h.wnd, nil, gatherFuzzStream[off:int(off)+n])
			h.injectSplit(b, 54+int(ctl>>3)*64)
			if ctl&4 != 0 {
				h.flushSends()
				noteAcks(h.flush())
			}
		}
		h.flushSends()
		h.batch = false
		noteAcks(h.flush())
		// Let kept data reach the socket (EPOLLOUT) and ACKs go out.
		for range 5 {
			h.now = h.now.Add(50 * time.Millisecond)
			h.tab.Timers(h.now)
			noteAcks(h.pump(0))
		}
		got := gatherReadAll(peer)
		if !bytes.Equal(got, gatherFuzzStream[:len(got)]) {
			i := 0
			for i < len(got) && got[i] == gatherFuzzStream[i] {
				i++
			}
			t.Fatalf("the peer read %d bytes that are not the guest's stream: first difference at %d", len(got), i)
		}
		acked := int(int32(maxAck - base))
		if fin && acked == len(got)+1 {
			acked-- // the FIN's sequence number
		}
		if acked > len(got) {
			t.Fatalf("%d bytes acknowledged to the guest, the peer read %d", acked, len(got))
		}
	})
}

// gatherReadAll reads what the peer has until it has been quiet for
// 10 ms (or reached EOF or an error): a loopback write is in the peer's
// queue when it returns.
func gatherReadAll(c *net.TCPConn) []byte {
	var got []byte
	buf := make([]byte, 64<<10)
	for {
		c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got
		}
	}
}

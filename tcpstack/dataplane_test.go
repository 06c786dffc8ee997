package tcpstack

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"vunet/tcpstack/header"
	"vunet/tcpstack/linksvc"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
	"vunet/virtqueue"
)

var (
	testGuestMAC = [6]byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	testGuestIP  = [4]byte{10, 0, 2, 15}
	testGwIP     = [4]byte{10, 0, 2, 2}
)

const (
	featModern = 1<<virtqueue.FeatureVersion1 | 1<<virtqueue.FeatureRingEventIdx
	featMrg    = featModern | 1<<virtqueue.FeatureNetMrgRxbuf
	featLegacy = uint64(0) // 10-byte header, no EVENT_IDX, no MRG
)

func arpRequest(senderIP, targetIP [4]byte) []byte {
	f := make([]byte, 42)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], testGuestMAC[:])
	binary.BigEndian.PutUint16(f[12:], uint16(header.EtherTypeARP))
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], uint16(header.EtherTypeIPv4))
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 1)
	copy(a[8:14], testGuestMAC[:])
	copy(a[14:18], senderIP[:])
	copy(a[24:28], targetIP[:])
	return f
}

func arpReplyFor(senderIP, targetIP [4]byte) []byte {
	f := make([]byte, 42)
	copy(f[0:6], testGuestMAC[:])
	copy(f[6:12], linksvc.DefaultOurMAC[:])
	binary.BigEndian.PutUint16(f[12:], uint16(header.EtherTypeARP))
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], uint16(header.EtherTypeIPv4))
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 2)
	copy(a[8:14], linksvc.DefaultOurMAC[:])
	copy(a[14:18], targetIP[:])
	copy(a[18:24], testGuestMAC[:])
	copy(a[24:28], senderIP[:])
	return f
}

func otherFrame(etherType uint16, n int) []byte {
	f := make([]byte, n)
	copy(f[0:6], linksvc.DefaultOurMAC[:])
	copy(f[6:12], testGuestMAC[:])
	binary.BigEndian.PutUint16(f[12:], etherType)
	return f
}

func TestTXBatchOneUsedUpdate(t *testing.T) {
	p := newTestPair(t, featModern, 256)
	const n = 40
	for i := 0; i < n; i++ {
		p.addTX(otherFrame(0x88b5, 60+i))
	}
	p.tx.Post()
	p.start() // the loop looks at the ring on start, without a kick
	waitFor(t, "TX used", 2*time.Second, func() bool { return p.tx.UsedIdx() == n })
	st := p.stats()
	if got := st.TX.Frames.Load(); got != n {
		t.Errorf("TX frames = %d, want %d", got, n)
	}
	if got := st.TX.Batches.Load(); got != 1 {
		t.Errorf("TX batches = %d, want 1", got)
	}
	if got := p.tx.Stats.Notifies.Load() + p.tx.Stats.NotifiesSuppressed.Load(); got != 1 {
		t.Errorf("TX flushes with publication = %d, want 1 (one used.idx update)", got)
	}
	if got := st.TXByEtherType[stats.EtherOther].Load(); got != n {
		t.Errorf("TX other ethertype = %d, want %d", got, n)
	}
	if got := st.TX.Drops[stats.DropUnknownEtherType].Load(); got != n {
		t.Errorf("unknown ethertype drops = %d, want %d", got, n)
	}
	var wantBytes uint64
	for i := 0; i < n; i++ {
		wantBytes += uint64(60 + i)
		_, l, ok := p.tx.popUsed()
		if !ok || l != 0 {
			t.Fatalf("used element %d: ok=%v len=%d, want len 0", i, ok, l)
		}
	}
	if got := st.TX.Bytes.Load(); got != wantBytes {
		t.Errorf("TX bytes = %d, want %d", got, wantBytes)
	}
	// A later batch goes through the kick path.
	for i := 0; i < 3; i++ {
		p.addTX(otherFrame(uint16(header.EtherTypeIPv4), 20)) // runt IPv4 (no IP header)
	}
	p.tx.Send()
	waitFor(t, "second batch", 2*time.Second, func() bool { return p.tx.UsedIdx() == n+3 })
	if got := st.TX.Batches.Load(); got != 2 {
		t.Errorf("TX batches = %d, want 2", got)
	}
	if got := st.TX.Drops[stats.DropMalformed].Load(); got != 3 {
		t.Errorf("malformed drops = %d, want 3", got)
	}
}

func TestTXBatchLargerThanBatchSize(t *testing.T) {
	p := newTestPair(t, featModern, 512)
	p.start()
	const n = 300
	for i := 0; i < n; i++ {
		p.addTX(otherFrame(0x88b5, 60))
	}
	p.tx.Send()
	waitFor(t, "TX used", 2*time.Second, func() bool { return p.tx.UsedIdx() == n })
	if got, want := p.stats().TX.Batches.Load(), uint64((n+txBatchMax-1)/txBatchMax); got != want {
		t.Errorf("batches = %d, want %d", got, want)
	}
}

// rxRead returns the frames written into used RX elements, virtio header
// decoded, MRG_RXBUF buffers reassembled.
func (p *testPair) rxRead(t *testing.T) (hdrs []virtqueue.NetHdr, frames [][]byte) {
	t.Helper()
	for {
		head, n, ok := p.rx.popUsed()
		if !ok {
			return
		}
		b := p.rx.Written(head, n)
		var h virtqueue.NetHdr
		if err := h.Decode(b[:p.hdrLen]); err != nil {
			t.Fatal(err)
		}
		data := append([]byte(nil), b[p.hdrLen:]...)
		for i := 1; i < int(h.NumBuffers); i++ {
			head, n, ok := p.rx.popUsed()
			if !ok {
				t.Fatalf("num_buffers %d but only %d used elements", h.NumBuffers, i)
			}
			data = append(data, p.rx.Written(head, n)...)
		}
		hdrs = append(hdrs, h)
		frames = append(frames, data)
	}
}

func TestARPRequestReply(t *testing.T) {
	for _, tc := range []struct {
		name string
		feat uint64
	}{{"modern", featModern}, {"mrg", featMrg}, {"legacy", featLegacy}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPair(t, tc.feat, 64)
			p.postRX(4, 2048)
			p.start()
			p.addTX(arpRequest(testGuestIP, testGwIP))
			p.tx.Send()
			waitFor(t, "ARP reply", 2*time.Second, func() bool { return p.rx.UsedIdx() == 1 })
			// used.idx is stored before the interrupt is decided: the call
			// may come a moment after the frame is visible.
			calls := uint64(0)
			waitFor(t, "the interrupt for the RX frame", 2*time.Second, func() bool {
				calls += p.rx.Calls()
				return calls > 0
			})
			hdrs, frames := p.rxRead(t)
			if len(frames) != 1 {
				t.Fatalf("got %d frames, want 1", len(frames))
			}
			if hdrs[0].NumBuffers != 1 && p.hdrLen == 12 {
				t.Errorf("num_buffers = %d, want 1", hdrs[0].NumBuffers)
			}
			if hdrs[0].Flags != 0 || hdrs[0].GSOType != 0 {
				t.Errorf("header %+v, want flags/gso 0", hdrs[0])
			}
			if want := arpReplyFor(testGuestIP, testGwIP); !bytes.Equal(frames[0], want) {
				t.Errorf("reply\n got %x\nwant %x", frames[0], want)
			}
			st := p.stats()
			if st.RX.Frames.Load() != 1 || st.RX.Bytes.Load() != 42 || st.ServiceReplies[stats.SvcARP].Load() != 1 ||
				st.TXByEtherType[stats.EtherARP].Load() != 1 {
				t.Errorf("stats: rx frames %d bytes %d arp replies %d tx arp %d", st.RX.Frames.Load(),
					st.RX.Bytes.Load(), st.ServiceReplies[stats.SvcARP].Load(), st.TXByEtherType[stats.EtherARP].Load())
			}
			if mac, ok := p.s.GuestMAC(); !ok || mac != testGuestMAC {
				t.Errorf("guest MAC = %v %v", mac, ok)
			}
			// A probe (sender 0.0.0.0) is not answered.
			p.addTX(arpRequest([4]byte{}, testGuestIP))
			p.tx.Send()
			waitFor(t, "probe consumed", 2*time.Second, func() bool { return p.tx.UsedIdx() == 2 })
			time.Sleep(10 * time.Millisecond)
			if p.rx.UsedIdx() != 1 {
				t.Errorf("ARP probe answered")
			}
		})
	}
}

func TestRXWaitsForDescriptors(t *testing.T) {
	for _, tc := range []struct {
		name string
		feat uint64
	}{{"event_idx", featModern}, {"no_notify_flag", featLegacy}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPair(t, tc.feat, 64)
			p.start()
			p.addTX(arpRequest(testGuestIP, testGwIP))
			p.tx.Send()
			st := p.stats()
			waitFor(t, "wait counted", 2*time.Second, func() bool { return st.RXWaitedForDescriptors.Load() == 1 })
			if p.rx.UsedIdx() != 0 {
				t.Fatalf("RX used without buffers")
			}
			// Refill as the guest does and kick only if the device asked.
			p.rx.AddBuffers(nil, 2048)
			start := time.Now()
			p.rx.Send()
			waitFor(t, "reply after refill", 2*time.Second, func() bool { return p.rx.UsedIdx() == 1 })
			if d := time.Since(start); d > time.Second {
				t.Errorf("reply took %v after the refill", d)
			}
			_, frames := p.rxRead(t)
			if len(frames) != 1 || !bytes.Equal(frames[0], arpReplyFor(testGuestIP, testGwIP)) {
				t.Fatalf("frames %x", frames)
			}
			if got := st.RXWaitedForDescriptors.Load(); got != 1 {
				t.Errorf("waited = %d, want 1", got)
			}
			// Once nothing waits, RX kicks are off again.
			time.Sleep(5 * time.Millisecond)
			if !virtqueue.HasFeature(tc.feat, virtqueue.FeatureRingEventIdx) {
				if p.rx.UsedFlags()&virtqueue.UsedFlagNoNotify == 0 {
					t.Errorf("RX kicks still enabled with nothing waiting")
				}
			}
		})
	}
}

func TestRXPendingOverflowDropsOldest(t *testing.T) {
	p := newTestPair(t, featModern, 256)
	p.start()
	const n = pendingReplies + 5
	for i := 0; i < n; i++ {
		p.addTX(arpRequest(testGuestIP, [4]byte{10, 0, 2, byte(100 + i)}))
	}
	p.tx.Send()
	st := p.stats()
	waitFor(t, "TX consumed", 2*time.Second, func() bool { return p.tx.UsedIdx() == n })
	waitFor(t, "overflow counted", 2*time.Second, func() bool { return st.RX.Drops[stats.DropPendingOverflow].Load() == 5 })
	for i := 0; i < n; i++ {
		p.rx.AddBuffers(nil, 128)
	}
	p.rx.Send()
	waitFor(t, "replies", 2*time.Second, func() bool { return p.rx.UsedIdx() == pendingReplies })
	_, frames := p.rxRead(t)
	if len(frames) != pendingReplies {
		t.Fatalf("%d frames", len(frames))
	}
	// The oldest five went; the first delivered answers request 5.
	if want := arpReplyFor(testGuestIP, [4]byte{10, 0, 2, 105}); !bytes.Equal(frames[0], want) {
		t.Errorf("first delivered reply %x, want %x", frames[0], want)
	}
}

func TestMRGRXBufSpanning(t *testing.T) {
	p := newTestPair(t, featMrg, 64)
	// 12-byte header + 42-byte ARP reply = 54 bytes: four 16-byte buffers.
	p.postRX(8, 16)
	p.start()
	p.addTX(arpRequest(testGuestIP, testGwIP))
	p.tx.Send()
	waitFor(t, "spanning reply", 2*time.Second, func() bool { return p.rx.UsedIdx() == 4 })
	hdrs, frames := p.rxRead(t)
	if len(frames) != 1 || hdrs[0].NumBuffers != 4 {
		t.Fatalf("frames %d, num_buffers %v", len(frames), hdrs)
	}
	if want := arpReplyFor(testGuestIP, testGwIP); !bytes.Equal(frames[0], want) {
		t.Errorf("reassembled\n got %x\nwant %x", frames[0], want)
	}
	p.s.StopPair(0) // LastAvail belongs to the loop while it runs
	if got := p.rx.Q.LastAvail(); got != 4 {
		t.Errorf("RX LastAvail = %d, want 4 (unused reservations rewound)", got)
	}
}

func TestMRGRXBufChainWithSeveralDescriptors(t *testing.T) {
	p := newTestPair(t, featMrg, 64)
	// A header split over two descriptors, then the frame over 3 more.
	p.rx.AddBuffers(nil, 5, 7, 20, 20, 20)
	p.rx.Post()
	p.start()
	p.addTX(arpRequest(testGuestIP, testGwIP))
	p.tx.Send()
	waitFor(t, "reply", 2*time.Second, func() bool { return p.rx.UsedIdx() == 1 })
	hdrs, frames := p.rxRead(t)
	if len(frames) != 1 || hdrs[0].NumBuffers != 1 || !bytes.Equal(frames[0], arpReplyFor(testGuestIP, testGwIP)) {
		t.Fatalf("hdr %+v frame %x", hdrs, frames)
	}
}

func TestNoMRGFrameTooBigDropped(t *testing.T) {
	p := newTestPair(t, featModern, 64)
	p.postRX(4, 16)
	p.start()
	p.addTX(arpRequest(testGuestIP, testGwIP))
	p.tx.Send()
	st := p.stats()
	waitFor(t, "no-fit drop", 2*time.Second, func() bool { return st.RX.Drops[stats.DropNoFit].Load() == 1 })
	p.s.StopPair(0)
	if p.rx.UsedIdx() != 0 || p.rx.Q.LastAvail() != 0 {
		t.Errorf("used %d last avail %d, want 0 0", p.rx.UsedIdx(), p.rx.Q.LastAvail())
	}
}

func TestStopPairRewindsReservations(t *testing.T) {
	p := newTestPair(t, featMrg, 64)
	// Two 16-byte buffers cannot hold the 54-byte reply: both are reserved,
	// then rewound.
	p.rx.AddBuffers(nil, 16)
	p.rx.AddBuffers(nil, 16)
	p.rx.Post()
	p.start()
	p.addTX(arpRequest(testGuestIP, testGwIP))
	p.tx.Send()
	st := p.stats()
	waitFor(t, "waiting", 2*time.Second, func() bool { return st.RXWaitedForDescriptors.Load() == 1 })
	p.s.StopPair(0)
	if got := p.rx.Q.LastAvail(); got != 0 {
		t.Errorf("RX LastAvail after stop = %d, want 0", got)
	}
	if got := p.tx.Q.LastAvail(); got != 1 || p.tx.UsedIdx() != 1 {
		t.Errorf("TX LastAvail %d used %d, want 1 1", got, p.tx.UsedIdx())
	}
	if p.rx.UsedIdx() != 0 {
		t.Errorf("RX used %d, want 0", p.rx.UsedIdx())
	}
	// Restart on fresh queues: the rewound buffers are used again.
	p.rx.AddBuffers(nil, 16)
	p.rx.AddBuffers(nil, 16)
	p.rx.Post()
	p.restart()
	if st.LoopStarts.Load() != 2 {
		t.Errorf("loop starts %d", st.LoopStarts.Load())
	}
	p.addTX(arpRequest(testGuestIP, testGwIP))
	p.tx.Send()
	waitFor(t, "reply after restart", 2*time.Second, func() bool { return p.rx.UsedIdx() == 4 })
	hdrs, frames := p.rxRead(t)
	if len(frames) != 1 || hdrs[0].NumBuffers != 4 {
		t.Fatalf("frames %d hdrs %+v", len(frames), hdrs)
	}
}

func TestDisabledRings(t *testing.T) {
	p := newTestPair(t, featModern, 64)
	p.qp.TXEnabled = false
	p.postRX(4, 2048)
	p.start()
	for i := 0; i < 5; i++ {
		p.addTX(arpRequest(testGuestIP, testGwIP))
	}
	p.tx.Send()
	waitFor(t, "TX discarded", 2*time.Second, func() bool { return p.tx.UsedIdx() == 5 })
	st := p.stats()
	if got := st.TX.Drops[stats.DropRingDisabled].Load(); got != 5 {
		t.Errorf("ring-disabled drops = %d, want 5", got)
	}
	time.Sleep(10 * time.Millisecond)
	if p.rx.UsedIdx() != 0 || st.ServiceReplies[stats.SvcARP].Load() != 0 {
		t.Errorf("disabled TX produced replies")
	}

	// RX disabled: TX is processed, no RX frame supplied.
	p.s.StopPair(0)
	p.qp.TXEnabled, p.qp.RXEnabled = true, false
	p.restart()
	p.addTX(arpRequest(testGuestIP, testGwIP))
	p.tx.Send()
	waitFor(t, "reply dropped", 2*time.Second, func() bool { return st.RX.Drops[stats.DropRingDisabled].Load() == 1 })
	p.s.StopPair(0)
	if p.rx.UsedIdx() != 0 || p.rx.Q.LastAvail() != 0 {
		t.Errorf("RX ring touched while disabled")
	}
}

func TestStartPairTwiceAndStopUnknown(t *testing.T) {
	p := newTestPair(t, featModern, 16)
	p.start()
	if err := p.s.StartPair(p.qp); err == nil {
		t.Fatal("second StartPair succeeded")
	}
	p.s.StopPair(7) // never started: no-op
	p.s.StopPair(0)
	p.s.StopPair(0)
	if err := p.s.StartPair(virtqueue.QueuePair{Index: 1}); err == nil {
		t.Fatal("StartPair with nil rings succeeded")
	}
}

func TestAnnounceAndMTU(t *testing.T) {
	s := New(Config{Logger: testenv.Logger()})
	if _, ok := s.GuestMAC(); ok {
		t.Fatal("guest MAC known before anything")
	}
	s.Announce(testGuestMAC)
	if mac, ok := s.GuestMAC(); !ok || mac != testGuestMAC {
		t.Fatalf("GuestMAC = %v %v", mac, ok)
	}
	if s.MTU() != linksvc.DefaultMTU {
		t.Fatalf("MTU %d", s.MTU())
	}
	s.SetMTU(1500)
	s.SetMTU(-1)
	if s.MTU() != 1500 {
		t.Fatalf("MTU %d", s.MTU())
	}
}

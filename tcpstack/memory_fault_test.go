package tcpstack

import (
	"encoding/binary"
	"net"
	"runtime/debug"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/stats"
)

// TestGuestMemoryShrunkUnderLoop: the front-end truncates the memory file
// while the guest sends. The loop's next touch of guest memory is a SIGBUS,
// which must stop that pair only: the process lives, the fault is counted,
// and StopPair still returns.
func TestGuestMemoryShrunkUnderLoop(t *testing.T) {
	for _, tc := range []struct {
		name    string
		traffic bool // a sender keeps posting frames while the memory goes
	}{
		{name: "idle-then-kick"},
		{name: "under-traffic", traffic: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPair(t, featModern, 256)
			var errFDs [2]int
			for i, r := range []*testRing{p.rx, p.tx} {
				fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { unix.Close(fd) })
				errFDs[i], r.errFD = fd, fd
				r.rebuild(i, 0)
			}
			p.start()
			frame := otherFrame(0x88b5, 60)
			stop := make(chan struct{})
			senderDone := make(chan struct{})
			if tc.traffic {
				go func() {
					defer close(senderDone)
					// The test's own mapping of guest memory faults too.
					debug.SetPanicOnFault(true)
					defer func() { recover() }()
					for {
						select {
						case <-stop:
							return
						default:
						}
						for {
							if _, _, ok := p.tx.popUsed(); !ok {
								break
							}
						}
						if p.tx.Free() > 0 {
							p.addTX(frame)
							p.tx.Send()
						} else {
							time.Sleep(50 * time.Microsecond)
						}
					}
				}()
				waitFor(t, "traffic", 2*time.Second, func() bool { return p.stats().TX.Frames.Load() >= 100 })
			} else {
				close(senderDone)
			}
			if err := unix.Ftruncate(p.mem.FD(), 0); err != nil {
				t.Fatal(err)
			}
			close(stop)
			<-senderDone
			// A kick touches no guest memory on our side; the loop's Pop does.
			p.tx.KickNow()
			st := p.stats()
			waitFor(t, "memory fault counted", 5*time.Second, func() bool { return st.MemoryFaults.Load() == 1 })
			stopped := make(chan struct{})
			go func() { p.s.StopPair(0); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				t.Fatal("StopPair did not return after a memory fault")
			}
			if got := st.MemoryFaults.Load(); got != 1 {
				t.Errorf("MemoryFaults = %d, want 1", got)
			}
			// The front-end hears of it on both vrings' error eventfds.
			for i, fd := range errFDs {
				var b [8]byte
				if n, err := unix.Read(fd, b[:]); err != nil || n != 8 || b[0] != 1 {
					t.Errorf("vring %d error eventfd: n=%d err=%v counter=%d, want 1", i, n, err, b[0])
				}
			}
			// The pair can be started again (on memory that works).
			if err := unix.Ftruncate(p.mem.FD(), testMemSize); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestGuestMemoryFaultDropsQueuedDatagrams: a TX batch queues a guest
// datagram for the batch's sendmmsg (its payload still in guest memory),
// and the next frame of the batch faults (the front-end truncated the
// memory under it). The queued datagram is dropped and counted, never sent
// from memory that may no longer be the guest's buffer — not by the
// faulting loop, and not by the next loop, whose first datagram would
// otherwise flush it.
func TestGuestMemoryFaultDropsQueuedDatagrams(t *testing.T) {
	pageSize := int64(unix.Getpagesize())
	p := newFlowPair(t, featModern, nil)
	p.start()
	peer, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	port := uint16(peer.LocalAddr().(*net.UDPAddr).Port)
	read := func(timeout time.Duration) (string, error) {
		buf := make([]byte, 256)
		peer.SetReadDeadline(time.Now().Add(timeout))
		n, _, err := peer.ReadFrom(buf)
		return string(buf[:n]), err
	}
	// The flow exists before the batch.
	p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte("open")))
	p.tx.Send()
	if got, err := read(5 * time.Second); got != "open" {
		t.Fatalf("peer got %q, %v", got, err)
	}
	stale := p.newTX(udpFrame(testGuest4, testGw4, 40000, port, []byte("stale")))
	p.tx.Alloc(uint64(2 * pageSize)) // the next chain's buffer on pages of its own
	faults := p.newTX(otherFrame(0x88b5, 60))
	gpa := binary.LittleEndian.Uint64(p.tx.DescTable()[16*int(faults):])
	cut := int64(gpa) &^ (pageSize - 1)
	if first := binary.LittleEndian.Uint64(p.tx.DescTable()[16*int(stale):]); int64(first)+200 > cut {
		t.Fatalf("layout: the datagram's buffer (%#x) reaches the cut (%#x)", first, cut)
	}
	if err := unix.Ftruncate(p.mem.FD(), cut); err != nil {
		t.Fatal(err)
	}
	p.tx.PutAvail(stale)
	p.tx.PutAvail(faults)
	p.tx.Send()
	st := p.stats()
	waitFor(t, "memory fault counted", 5*time.Second, func() bool { return st.MemoryFaults.Load() == 1 })
	if n := st.Proto.UDPDrops[stats.FromGuest][stats.DropQueueBroken].Load(); n != 1 {
		t.Errorf("%d datagrams dropped with the broken queue, want 1", n)
	}
	// The memory comes back (the front-end's new table, say) and the pair
	// runs again; the guest's next datagram is the first the peer gets.
	if err := unix.Ftruncate(p.mem.FD(), testMemSize); err != nil {
		t.Fatal(err)
	}
	p.restart()
	p.addTX(udpFrame(testGuest4, testGw4, 40000, port, []byte("fresh")))
	p.tx.Send()
	if got, err := read(5 * time.Second); got != "fresh" {
		t.Fatalf("peer got %q, %v; want the datagram sent after the fault, not the one queued before it", got, err)
	}
	if got, err := read(200 * time.Millisecond); err == nil {
		t.Fatalf("peer got %q after the fresh datagram", got)
	}
}

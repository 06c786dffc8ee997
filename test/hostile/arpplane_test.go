package hostile

import (
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
)

// arpPlane is a minimal data plane for these tests: it returns every TX
// chain used and answers ARP requests on RX. It depends only on the
// contract's virtqueue API, so the hostile tests run while tcpstack is being
// written (and do not blame tcpstack for control-plane bugs).
type arpPlane struct {
	mu    sync.Mutex
	loops map[int]*arpLoop
	// broken counts queues that reported ErrBroken.
	broken atomic.Uint64
	// frames counts TX frames seen (good chains).
	frames atomic.Uint64
}

var ourMAC = [6]byte{0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55}

type arpLoop struct {
	qp   virtqueue.QueuePair
	p    *arpPlane
	stop chan struct{}
	done chan struct{}
}

func newARPPlane() *arpPlane { return &arpPlane{loops: map[int]*arpLoop{}} }

func (p *arpPlane) StartPair(qp virtqueue.QueuePair) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.loops[qp.Index]; ok {
		return errors.New("pair already running")
	}
	l := &arpLoop{qp: qp, p: p, stop: make(chan struct{}), done: make(chan struct{})}
	p.loops[qp.Index] = l
	go l.run()
	return nil
}

func (p *arpPlane) StopPair(index int) {
	p.mu.Lock()
	l := p.loops[index]
	delete(p.loops, index)
	p.mu.Unlock()
	if l != nil {
		close(l.stop)
		<-l.done
	}
}

func (l *arpLoop) run() {
	defer close(l.done)
	var c virtqueue.Chain
	hdrLen := virtqueue.NetHdrLenFor(l.qp.Features)
	frame := make([]byte, 2048)
	var pending [][]byte
	txBroken, rxBroken := false, false
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		for !txBroken {
			ok, err := l.qp.TX.Pop(&c)
			if err != nil {
				txBroken = true
				l.p.broken.Add(1)
				break
			}
			if !ok {
				break
			}
			n := gather(frame, c.Readable)
			l.qp.TX.Push(c.Head, 0)
			l.p.frames.Add(1)
			if n >= hdrLen+42 && len(pending) < 64 {
				if r := arpAnswer(frame[hdrLen:n]); r != nil {
					pending = append(pending, r)
				}
			}
		}
		l.qp.TX.Flush()
		for len(pending) > 0 && l.qp.RXEnabled && !rxBroken {
			ok, err := l.qp.RX.Pop(&c)
			if err != nil {
				rxBroken = true
				l.p.broken.Add(1)
				break
			}
			if !ok {
				break
			}
			out := make([]byte, hdrLen+len(pending[0]))
			h := virtqueue.NetHdr{NumBuffers: 1}
			h.Encode(out[:hdrLen])
			copy(out[hdrLen:], pending[0])
			if c.WritableLen() < len(out) {
				l.qp.RX.Push(c.Head, 0)
				continue
			}
			l.qp.RX.Push(c.Head, uint32(scatter(c.Writable, out)))
			pending = pending[1:]
		}
		l.qp.RX.Flush()
		fds := []unix.PollFd{{Fd: int32(l.qp.TX.KickFD()), Events: unix.POLLIN}, {Fd: int32(l.qp.RX.KickFD()), Events: unix.POLLIN}}
		unix.Poll(fds, 2)
		l.qp.TX.DrainKick()
		l.qp.RX.DrainKick()
	}
}

func gather(dst []byte, src [][]byte) int {
	n := 0
	for _, s := range src {
		n += copy(dst[n:], s)
		if n == len(dst) {
			break
		}
	}
	return n
}

func scatter(dst [][]byte, src []byte) int {
	n := 0
	for _, d := range dst {
		n += copy(d, src[n:])
		if n == len(src) {
			break
		}
	}
	return n
}

// arpAnswer returns the reply to an ARP request (any target), or nil.
func arpAnswer(f []byte) []byte {
	if binary.BigEndian.Uint16(f[12:]) != 0x0806 || binary.BigEndian.Uint16(f[20:]) != 1 {
		return nil
	}
	r := make([]byte, 42)
	copy(r[0:6], f[22:28])
	copy(r[6:12], ourMAC[:])
	binary.BigEndian.PutUint16(r[12:], 0x0806)
	copy(r[14:20], f[14:20])
	binary.BigEndian.PutUint16(r[20:], 2)
	copy(r[22:28], ourMAC[:])
	copy(r[28:32], f[38:42])
	copy(r[32:38], f[22:28])
	copy(r[38:42], f[28:32])
	return r
}

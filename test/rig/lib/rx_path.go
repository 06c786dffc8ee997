package rig

import (
	"encoding/binary"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"vunet/test/frontend"
)

// rxPath is one RX ring's front-end side (back-end → guest): the frames the
// back-end completed go to the TAP as they are (virtio-net header first)
// and their buffers are posted again at once, or, in slow-reader mode,
// held until the timer fires every slowRX. Its RX loop serves it when the
// ring's call fires; in the rig alone, the device serves it right after it
// filled the ring, on the thread that moved the frames (bridge.serveRX).
// mu makes the two exclusive.
type rxPath struct {
	mu   sync.Mutex
	b    *bridge
	pair int
	rx   *frontend.FixedRing
	size int
	// frame and frameLens are the used heads of the frame being assembled
	// (MRG_RXBUF), want the buffers it has.
	frame     []uint16
	frameLens []uint32
	want      int
	held      []uint16 // buffers the slow reader holds back
	timer     int      // timerfd of the slow reader, -1 without
	armed     bool
	reposted  int
	w         rxWriter
	imp       impairer
	release   func([]uint16) // p.giveBack, made once
}

func newRXPath(b *bridge, pair int) (*rxPath, error) {
	rx := b.rx[pair]
	size := int(rx.Ring().Size())
	p := &rxPath{b: b, pair: pair, rx: rx, size: size, timer: -1,
		frame: make([]uint16, 0, size), frameLens: make([]uint32, 0, size), held: make([]uint16, 0, size),
		imp: newImpairer(b.impair, b.seed, 1+uint64(pair), &b.stats.Impaired[1])}
	p.w = rxWriter{b: b, pair: pair, rx: rx, iov: make([]unix.Iovec, size)}
	p.release = p.giveBack
	if b.slowRX > 0 {
		var err error
		if p.timer, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err != nil {
			return nil, fmt.Errorf("timerfd: %w", err)
		}
	}
	// Every buffer goes to the back-end before anything runs.
	for {
		id, ok := rx.Get()
		if !ok {
			break
		}
		rx.Post(id, 0)
	}
	if _, err := rx.Publish(); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *rxPath) close() {
	if p.timer >= 0 {
		unix.Close(p.timer)
		p.timer = -1
	}
}

// giveBack gives a written (or dropped) frame's buffers back.
func (p *rxPath) giveBack(heads []uint16) {
	for _, h := range heads {
		if p.b.slowRX > 0 {
			p.held = append(p.held, h)
		} else {
			p.rx.Post(h, 0)
			p.reposted++
		}
	}
}

// serve writes every frame the back-end completed to the TAP and posts
// the buffers again (or holds them, arming the slow reader's timer).
// Callers hold mu.
func (p *rxPath) serve() error {
	b, rx := p.b, p.rx
	p.reposted = 0
	for {
		u, ok, err := rx.PopUsed()
		if !ok {
			break
		}
		if err != nil {
			b.stats.DeviceErrors.Add(1)
			return err
		}
		id := uint16(u.ID)
		if len(p.frame) == 0 {
			p.want = 1
			if b.mrg {
				if int(u.Len) < b.hdrLen {
					return fmt.Errorf("rx: used length %d below the %d-byte header", u.Len, b.hdrLen)
				}
				p.want = int(binary.LittleEndian.Uint16(rx.Buf(id)[10:12]))
				if p.want < 1 || p.want > p.size {
					return fmt.Errorf("rx: num_buffers %d with a %d-entry ring", p.want, p.size)
				}
			}
		}
		p.frame = append(p.frame, id)
		p.frameLens = append(p.frameLens, u.Len)
		if len(p.frame) < p.want {
			continue
		}
		p.imp.deliver(&p.w, p.frame, p.frameLens, p.release)
		p.frame, p.frameLens = p.frame[:0], p.frameLens[:0]
	}
	// Nothing more for now: a frame held back to be reordered goes.
	p.imp.flushRX(&p.w, p.release)
	if p.reposted > 0 {
		if _, err := rx.Publish(); err != nil {
			return err
		}
	}
	if len(p.held) > 0 && !p.armed {
		ts := unix.NsecToTimespec(b.slowRX.Nanoseconds())
		if err := unix.TimerfdSettime(p.timer, 0, &unix.ItimerSpec{Value: ts}, nil); err != nil {
			return fmt.Errorf("timerfd_settime: %w", err)
		}
		p.armed = true
		b.stats.RXHeldBatches.Add(1)
	}
	return nil
}

// repostHeld gives the slow reader's held buffers back when its timer
// fired. Callers hold mu.
func (p *rxPath) repostHeld() error {
	drain(p.timer)
	p.armed = false
	for _, h := range p.held {
		p.rx.Post(h, 0)
	}
	p.held = p.held[:0]
	_, err := p.rx.Publish()
	return err
}

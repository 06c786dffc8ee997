package load

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// pattern is a deterministic pseudo-random byte source (xorshift64*): the
// receiving end of a Stream makes the same bytes and compares, so a lost,
// duplicated or corrupted byte is caught where it happens, whatever the
// length of the stream.
type pattern struct{ s uint64 }

func newPattern(seed uint64) *pattern { return &pattern{s: seed | 1} }

func (g *pattern) fill(b []byte) {
	for len(b) >= 8 {
		g.s ^= g.s >> 12
		g.s ^= g.s << 25
		g.s ^= g.s >> 27
		binary.LittleEndian.PutUint64(b, g.s*2685821657736338717)
		b = b[8:]
	}
	if len(b) > 0 {
		var last [8]byte
		g.fill(last[:])
		copy(b, last[:])
	}
}

// Ends are the two sides of a guest connection: Listen makes a listener on
// the host side, Dial connects to it from the guest (through the back-end).
type Ends struct {
	Listen func() (net.Listener, error)
	Dial   func(ctx context.Context, port int) (net.Conn, error)
}

// Stream is one TCP connection through the back-end carrying a
// deterministic byte stream one way, checked byte for byte by the
// receiver, until Stop.
type Stream struct {
	// ToHost: the guest sends.
	ToHost   bool
	sent     atomic.Int64
	verified atomic.Int64
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	err      error
	conns    [2]net.Conn
}

// StartStream connects the two ends and starts the stream; rate bounds
// the bytes a second (0: as fast as it goes).
func StartStream(ctx context.Context, e Ends, toHost bool, rate int64) (*Stream, error) {
	l, err := e.Listen()
	if err != nil {
		return nil, err
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	gc, err := e.Dial(ctx, l.Addr().(*net.TCPAddr).Port)
	if err != nil {
		return nil, fmt.Errorf("guest dial: %w", err)
	}
	var hc net.Conn
	select {
	case c, ok := <-accepted:
		if !ok {
			gc.Close()
			return nil, errors.New("host accept failed")
		}
		hc = c
	case <-ctx.Done():
		gc.Close()
		return nil, ctx.Err()
	}
	s := &Stream{ToHost: toHost, stop: make(chan struct{}), done: make(chan struct{}), conns: [2]net.Conn{gc, hc}}
	snd, rcv := hc, gc
	if toHost {
		snd, rcv = gc, hc
	}
	seed := uint64(time.Now().UnixNano())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.send(snd, seed, rate) }()
	go func() { defer wg.Done(); s.receive(rcv, seed) }()
	go func() { wg.Wait(); gc.Close(); hc.Close(); close(s.done) }()
	return s, nil
}

func (s *Stream) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	// Unblock the other end.
	for _, c := range s.conns {
		c.SetDeadline(time.Now())
	}
}

func (s *Stream) send(c net.Conn, seed uint64, rate int64) {
	g := newPattern(seed)
	buf := make([]byte, 64<<10)
	start := time.Now()
	for {
		select {
		case <-s.stop:
			if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
				s.fail(fmt.Errorf("close write after %d bytes: %w", s.sent.Load(), err))
			}
			return
		default:
		}
		if rate > 0 {
			due := start.Add(time.Duration(float64(s.sent.Load()) / float64(rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(min(d, 100*time.Millisecond))
				continue
			}
		}
		g.fill(buf)
		n, err := c.Write(buf)
		s.sent.Add(int64(n))
		if err != nil {
			s.fail(fmt.Errorf("write after %d bytes: %w", s.sent.Load(), err))
			return
		}
	}
}

func (s *Stream) receive(c net.Conn, seed uint64) {
	g := newPattern(seed)
	buf := make([]byte, 64<<10)
	want := make([]byte, 64<<10)
	// The pattern is made 8 bytes at a time: keep what is left over.
	var pend []byte
	for {
		n, err := c.Read(buf)
		got := buf[:n]
		for len(got) > 0 {
			if len(pend) == 0 {
				g.fill(want)
				pend = want
			}
			k := min(len(got), len(pend))
			if !bytes.Equal(got[:k], pend[:k]) {
				i := 0
				for got[i] == pend[i] {
					i++
				}
				s.fail(fmt.Errorf("byte %d differs from what was sent", s.verified.Load()+int64(i)))
				return
			}
			s.verified.Add(int64(k))
			got, pend = got[k:], pend[k:]
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			s.fail(fmt.Errorf("read after %d bytes: %w", s.verified.Load(), err))
			return
		}
	}
}

// Verified is how many bytes the receiver has checked so far.
func (s *Stream) Verified() int64 { return s.verified.Load() }

// Err is the stream's first failure so far, nil while it is healthy.
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Stop ends the stream: the sender closes its side, the receiver checks
// everything up to the end. It returns the first failure, or one when the
// receiver did not get every byte sent within timeout.
func (s *Stream) Stop(timeout time.Duration) error {
	close(s.stop)
	select {
	case <-s.done:
	case <-time.After(timeout):
		s.fail(fmt.Errorf("stream did not end within %v of its stop (%d sent, %d verified)", timeout, s.sent.Load(), s.verified.Load()))
		<-s.done
	}
	if err := s.Err(); err != nil {
		return err
	}
	if s.sent.Load() != s.verified.Load() {
		return fmt.Errorf("%d bytes sent, %d received", s.sent.Load(), s.verified.Load())
	}
	return nil
}

package rig

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stream is a deterministic pseudo-random byte source (xorshift64*): fast
// enough not to be the bottleneck, and never periodic at any size a lost or
// duplicated segment could hide behind.
type stream struct{ s uint64 }

func (g *stream) fill(b []byte) {
	for len(b) >= 8 {
		g.s ^= g.s >> 12
		g.s ^= g.s << 25
		g.s ^= g.s >> 27
		binary.LittleEndian.PutUint64(b, g.s*2685821657736338717)
		b = b[8:]
	}
	for i := range b {
		b[i] = byte(g.s >> (8 * i))
	}
}

// send writes n bytes of the stream seeded with seed and returns their
// SHA-256; counter follows progress.
func send(c net.Conn, n int64, seed uint64, counter *atomic.Int64) ([32]byte, error) {
	h := sha256.New()
	g := &stream{s: seed | 1}
	buf := make([]byte, 256<<10)
	for n > 0 {
		k := int64(len(buf))
		if n < k {
			k = n
		}
		g.fill(buf[:k])
		h.Write(buf[:k])
		w, err := c.Write(buf[:k])
		counter.Add(int64(w))
		if err != nil {
			var sum [32]byte
			return sum, fmt.Errorf("write after %d bytes: %w", counter.Load(), err)
		}
		n -= k
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// receive reads to EOF, hashing; counter follows progress.
func receive(c net.Conn, counter *atomic.Int64) ([32]byte, error) {
	h := sha256.New()
	buf := make([]byte, 256<<10)
	var sum [32]byte
	for {
		k, err := c.Read(buf)
		if k > 0 {
			h.Write(buf[:k])
			counter.Add(int64(k))
		}
		if errors.Is(err, io.EOF) {
			copy(sum[:], h.Sum(nil))
			return sum, nil
		}
		if err != nil {
			return sum, fmt.Errorf("read after %d bytes: %w", counter.Load(), err)
		}
	}
}

// transferResult is one measured transfer.
type transferResult struct {
	Bytes     int64
	Elapsed   time.Duration
	PerSecond []int64 // bytes received in each whole second
}

func (r transferResult) gbits() float64 {
	return float64(r.Bytes) * 8 / r.Elapsed.Seconds() / 1e9
}

// transfer moves n bytes between a host peer on the back-end namespace's
// loopback and the guest, which connects to the gateway address; toHost
// says the guest sends. Both ends hash what they saw; the hashes, the byte
// counts and the per-second progress are checked. A second after the first
// with nothing received fails the test (a stall) when noStall is set. When,
// after five seconds, the rate so far cannot finish n bytes within timeout,
// the transfer is abandoned at once and the test fails with the projection
// (a slow path should not eat the whole suite's time budget).
func transfer(t testing.TB, r *Rig, toHost bool, n int64, timeout time.Duration, noStall bool) transferResult {
	t.Helper()
	return transferBetween(t, rigEnds(r), toHost, n, timeout, noStall)
}

// transferBetween is transfer over any pair of ends.
func transferBetween(t testing.TB, e ends, toHost bool, n int64, timeout time.Duration, noStall bool) transferResult {
	t.Helper()
	return transferLimits(t, e, toHost, n, timeout, noStall, 0)
}

// ends are the two sides of a transfer: a listener on the host side and a
// dialer on the guest side that reaches it.
type ends struct {
	listen func() (net.Listener, error)
	dial   func(ctx context.Context, port int) (net.Conn, error)
	// server is the address dial connects to; inClient runs a function in
	// the dialling side's namespace (BenchmarkRigConnect's blocking client).
	server   netip.Addr
	inClient func(fn func() error) error
}

// rigEnds: a host peer on the back-end namespace's loopback, reached by the
// guest through its gateway address.
func rigEnds(r *Rig) ends {
	return ends{
		server:   r.Gateway(),
		inClient: r.InGuest,
		listen:   func() (net.Listener, error) { return r.HostListen("tcp4", "127.0.0.1:0") },
		dial: func(ctx context.Context, port int) (net.Conn, error) {
			return r.GuestDial(ctx, "tcp4", net.JoinHostPort(r.Gateway().String(), strconv.Itoa(port)))
		},
	}
}

// rigAloneEnds: a peer listening on the peer namespace's TAP address,
// dialled from the guest namespace.
func rigAloneEnds(r *Rig) ends {
	return ends{
		server:   r.Gateway(),
		inClient: r.InGuest,
		listen:   func() (net.Listener, error) { return r.HostListen("tcp4", r.Gateway().String()+":0") },
		dial: func(ctx context.Context, port int) (net.Conn, error) {
			return r.GuestDial(ctx, "tcp4", net.JoinHostPort(r.Gateway().String(), strconv.Itoa(port)))
		},
	}
}

// transferLimits is transferBetween that also gives up, and fails, as
// soon as maxSilence (> 0) passes with no byte received.
func transferLimits(t testing.TB, e ends, toHost bool, n int64, timeout time.Duration, noStall bool, maxSilence time.Duration) transferResult {
	t.Helper()
	dir := "host→guest"
	if toHost {
		dir = "guest→host"
	}
	l, err := e.listen()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	deadline := time.Now().Add(timeout)
	seed := uint64(time.Now().UnixNano())

	var sent, got atomic.Int64
	var connMu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		connMu.Lock()
		conns = append(conns, c)
		connMu.Unlock()
	}
	var sendSum, recvSum [32]byte
	var sendErr, recvErr error
	var wg sync.WaitGroup
	// run plays one end: the sender half-closes and waits for the
	// receiver's close, so no unread data turns into an RST.
	run := func(c net.Conn, sender bool) {
		defer wg.Done()
		defer c.Close()
		c.SetDeadline(deadline)
		if sender {
			sendSum, sendErr = send(c, n, seed, &sent)
			if sendErr == nil {
				c.(interface{ CloseWrite() error }).CloseWrite()
				io.Copy(io.Discard, c)
			}
			return
		}
		recvSum, recvErr = receive(c, &got)
	}
	wg.Add(2)
	go func() {
		c, err := l.Accept()
		if err != nil {
			sendErr = err
			wg.Done()
			return
		}
		track(c)
		run(c, !toHost)
	}()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	c, err := e.dial(ctx, port)
	if err != nil {
		l.Close()
		wg.Done()
		wg.Wait()
		t.Fatalf("%s: guest dial port %d: %v", dir, port, err)
	}
	start := time.Now()
	track(c)
	go run(c, toHost)

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	res := transferResult{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := int64(0)
	var stalls []int
	var projected, silent time.Duration
	lastProgress := start
	closeAll := func() {
		connMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connMu.Unlock()
	}
loop:
	for {
		select {
		case <-done:
			break loop
		case <-tick.C:
			cur := got.Load()
			res.PerSecond = append(res.PerSecond, cur-last)
			if cur == last && len(res.PerSecond) > 1 {
				stalls = append(stalls, len(res.PerSecond))
			}
			if cur != last {
				lastProgress = time.Now()
			} else if s := time.Since(lastProgress); maxSilence > 0 && s >= maxSilence && silent == 0 {
				silent = s
				closeAll()
			}
			last = cur
			if el := time.Since(start); len(res.PerSecond) >= 5 && projected == 0 {
				if p := time.Duration(float64(el) * float64(n) / float64(max(cur, 1))); p > timeout {
					projected = p
					closeAll()
				}
			}
		}
	}
	res.Elapsed = time.Since(start)
	res.Bytes = got.Load()
	t.Logf("%s: %d bytes in %v = %.2f Gbit/s; MB per second: %v", dir, res.Bytes, res.Elapsed.Round(time.Millisecond), res.gbits(), mb(res.PerSecond))
	if silent > 0 {
		t.Fatalf("%s: no progress for %v after %d of %d bytes: given up", dir, silent.Round(time.Second), res.Bytes, n)
	}
	if projected > 0 {
		t.Fatalf("%s: abandoned after %v: at %.1f MB/s, %d MiB would take %v (budget %v)", dir, res.Elapsed.Round(time.Second),
			float64(res.Bytes)/res.Elapsed.Seconds()/1e6, n>>20, projected.Round(time.Second), timeout)
	}
	if sendErr != nil || recvErr != nil {
		t.Fatalf("%s: sender: %v; receiver: %v (sent %d, received %d)", dir, sendErr, recvErr, sent.Load(), got.Load())
	}
	if res.Bytes != n || sent.Load() != n {
		t.Fatalf("%s: sent %d, received %d, want %d", dir, sent.Load(), res.Bytes, n)
	}
	if sendSum != recvSum {
		t.Fatalf("%s: SHA-256 differs: sent %x, received %x", dir, sendSum, recvSum)
	}
	if noStall && len(stalls) > 0 {
		t.Errorf("%s: no bytes received in second(s) %v after the first", dir, stalls)
	}
	return res
}

func mb(v []int64) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = x >> 20
	}
	return out
}

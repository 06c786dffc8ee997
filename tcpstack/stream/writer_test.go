package stream

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/stats"
)

// drain reads everything the peer end has and parses it into frames
// appended to got; rest is an incomplete frame carried over.
func drain(t *testing.T, fd int, rest []byte, got [][]byte) ([]byte, [][]byte) {
	t.Helper()
	buf := make([]byte, 256<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		rest = append(rest, buf[:n]...)
	}
	for {
		f, n, err := Parse(rest)
		if err != nil {
			t.Fatalf("the writer broke the framing: %v", err)
		}
		if n == 0 {
			return rest, got
		}
		got = append(got, bytes.Clone(f))
		rest = rest[n:]
	}
}

// setSndbuf makes fd's send buffer small (the kernel doubles it).
func setSndbuf(t *testing.T, fd, n int) {
	t.Helper()
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, n); err != nil {
		t.Fatal(err)
	}
}

// TestWriterRandomized drives the writer as the producers do (several
// reservations outstanding, commits short of what was reserved, aborts,
// copied frames) against a peer that reads at random moments through a
// small socket buffer, so writes stop short, the send buffer wraps and
// reservations fail, then checks that the peer received exactly the
// committed frames, intact and in order, and that no frame was committed
// into a reservation that had failed.
func TestWriterRandomized(t *testing.T) {
	for seed := uint64(0); seed < 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		a, b := socketPair(t)
		setSndbuf(t, a, 16<<10)
		var st stats.Queue
		var w Writer
		w.Init(a, 0, &st, testLog) // the smallest send buffer
		var want, got [][]byte
		var rest []byte
		waits := 0
		for op := 0; op < 400; op++ {
			w.BeginIteration()
			switch rng.IntN(6) {
			case 0:
				f := pattern(rng, MinFrame+rng.IntN(3000))
				if s := w.WriteFrame(f, 0); s == guestring.OK {
					want = append(want, f)
				} else if s != guestring.NoDesc && s != guestring.Limited {
					t.Fatalf("seed %d: WriteFrame: %v", seed, s)
				}
			case 1, 2, 3:
				type res struct {
					hdr, h []byte
					pay    []byte
				}
				var rs []res
				for j := 0; j < 1+rng.IntN(6); j++ {
					hl := MinFrame + rng.IntN(100)
					maxPay := rng.IntN(70000)
					hdr, pay, s := w.Reserve(hl, maxPay)
					if s != guestring.OK {
						if s == guestring.NoDesc && !w.Starved() || s == guestring.Limited && !w.Limited() {
							t.Fatalf("seed %d: %v without the state saying so", seed, s)
						}
						waits++
						break
					}
					if len(hdr) != hl {
						t.Fatalf("seed %d: header %d bytes, want %d", seed, len(hdr), hl)
					}
					wantPay := min(maxPay, MaxFrame-hl)
					if n := iovLen(pay); n != wantPay {
						t.Fatalf("seed %d: payload %d bytes, want %d", seed, n, wantPay)
					}
					h := pattern(rng, hl)
					copy(hdr, h)
					var p []byte
					if len(pay) > 0 {
						p = pay[0]
					}
					rs = append(rs, res{hdr, h, p})
				}
				for j := 0; j < rng.IntN(len(rs)+1); j++ {
					n := rng.IntN(len(rs[j].pay) + 1)
					data := pattern(rng, n)
					copy(rs[j].pay, data)
					w.Commit(n, nil)
					want = append(want, append(bytes.Clone(rs[j].h), data...))
				}
				w.Abort()
			case 4:
				w.Publish()
			default:
				rest, got = drain(t, b, rest, got)
				if w.Blocked() {
					w.Writable()
				}
			}
			if err := w.Err(); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
		for w.Queued() > 0 {
			w.Publish()
			rest, got = drain(t, b, rest, got)
			w.Writable()
		}
		rest, got = drain(t, b, rest, got)
		if len(rest) != 0 {
			t.Fatalf("seed %d: %d bytes of a frame left over", seed, len(rest))
		}
		if len(got) != len(want) {
			t.Fatalf("seed %d: %d frames arrived, want %d", seed, len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("seed %d: frame %d differs (%d bytes, want %d)", seed, i, len(got[i]), len(want[i]))
			}
		}
		if st.RX.Frames.Load() != uint64(len(want)) {
			t.Fatalf("seed %d: counted %d frames, committed %d", seed, st.RX.Frames.Load(), len(want))
		}
		if seed == 0 && (waits == 0 || st.Stream.WriteWaits.Load() == 0) {
			t.Fatalf("the test did not exercise back-pressure: %d failed reservations, %d write waits", waits, st.Stream.WriteWaits.Load())
		}
	}
}

func iovLen(b [][]byte) int {
	n := 0
	for _, x := range b {
		n += len(x)
	}
	return n
}

// TestWriterBackpressure: with a peer that does not read, frames are
// committed until the socket and the send buffer are full; then
// reservations fail with NoDesc (Starved, Blocked: the loop watches
// EPOLLOUT) and a frame half written waits. Once the peer reads, every
// committed frame arrives whole, the half-written one first.
func TestWriterBackpressure(t *testing.T) {
	a, b := socketPair(t)
	setSndbuf(t, a, 8<<10)
	var st stats.Queue
	var w Writer
	w.Init(a, 0, &st, testLog)
	rng := rand.New(rand.NewPCG(3, 3))
	var want [][]byte
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatal("the writer never pushed back")
		}
		w.BeginIteration()
		hdr, pay, s := w.Reserve(54, 9000)
		if s == guestring.NoDesc {
			break
		}
		if s != guestring.OK {
			t.Fatalf("reserve: %v", s)
		}
		f := pattern(rng, 54+9000)
		copy(hdr, f)
		copy(pay[0], f[54:])
		w.Commit(9000, nil)
		want = append(want, f)
		w.Publish()
	}
	if !w.Starved() || !w.Blocked() {
		t.Fatalf("NoDesc, but starved %v, blocked %v", w.Starved(), w.Blocked())
	}
	if st.Stream.WriteWaits.Load() == 0 {
		t.Fatal("no write waited")
	}
	if w.Queued() == 0 {
		t.Fatal("nothing waits in the send buffer")
	}
	// A blocked writer does not retry on its own (no EAGAIN spinning).
	writes := st.Stream.Writes.Load()
	w.Publish()
	if st.Stream.Writes.Load() != writes {
		t.Fatal("Publish wrote while blocked, before EPOLLOUT")
	}
	var got [][]byte
	var rest []byte
	for w.Queued() > 0 {
		rest, got = drain(t, b, rest, got)
		w.Writable()
	}
	rest, got = drain(t, b, rest, got)
	if len(rest) != 0 || len(got) != len(want) {
		t.Fatalf("%d frames arrived (%d bytes left over), %d committed", len(got), len(rest), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d differs", i)
		}
	}
	if w.Blocked() {
		t.Fatal("still blocked with the queue empty")
	}
	w.BeginIteration()
	if _, _, s := w.Reserve(54, 9000); s != guestring.OK {
		t.Fatalf("after the drain: %v", s)
	}
	w.Abort()
}

// TestWriterLimited: reservations of this iteration alone can fill the
// send buffer; that is Limited (come back after publishing), not a wait
// for the socket.
func TestWriterLimited(t *testing.T) {
	a, _ := socketPair(t)
	var st stats.Queue
	var w Writer
	w.Init(a, 0, &st, testLog)
	n := 0
	for {
		_, _, s := w.Reserve(54, MaxFrame)
		if s == guestring.Limited {
			break
		}
		if s != guestring.OK {
			t.Fatalf("reservation %d: %v", n, s)
		}
		n++
	}
	if n < 3 || !w.Limited() || w.Starved() {
		t.Fatalf("%d reservations; limited %v, starved %v", n, w.Limited(), w.Starved())
	}
	w.Abort()
	if _, _, s := w.Reserve(54, MaxFrame); s != guestring.OK {
		t.Fatalf("after Abort: %v", s)
	}
}

// TestWriterPeerGone: a write to a closed peer fails the writer: Err is
// set, reservations say Broken, nothing more is written.
func TestWriterPeerGone(t *testing.T) {
	a, b := socketPair(t)
	var st stats.Queue
	var w Writer
	w.Init(a, 0, &st, testLog)
	unix.Close(b)
	if s := w.WriteFrame(make([]byte, 60), 0); s != guestring.OK {
		t.Fatalf("WriteFrame: %v", s)
	}
	w.Publish()
	if !errors.Is(w.Err(), unix.EPIPE) && !errors.Is(w.Err(), unix.ECONNRESET) {
		t.Fatalf("err %v, want EPIPE or ECONNRESET", w.Err())
	}
	if _, _, s := w.Reserve(54, 100); s != guestring.Broken {
		t.Fatalf("reserve after the error: %v", s)
	}
	if w.Queued() != 0 || st.Stream.WriteErrors.Load() != 1 {
		t.Fatalf("queued %d, write errors %d", w.Queued(), st.Stream.WriteErrors.Load())
	}
}

// TestWriterFrameCap: a payload is cut so the frame stays within
// MaxFrame, and MoreLater says waiting will not help.
func TestWriterFrameCap(t *testing.T) {
	a, _ := socketPair(t)
	var w Writer
	w.Init(a, 0, new(stats.Queue), testLog)
	hdr, pay, s := w.Reserve(42, 65507)
	if s != guestring.OK || len(hdr) != 42 || iovLen(pay) != MaxFrame-42 || w.MoreLater() {
		t.Fatalf("%v, header %d, payload %d, more later %v", s, len(hdr), iovLen(pay), w.MoreLater())
	}
	w.Abort()
	if s := w.WriteFrame(make([]byte, MaxFrame+1), 0); s != guestring.NoFit {
		t.Fatalf("an oversized frame: %v", s)
	}
	if _, _, s := w.Reserve(maxHdr+1, 0); s != guestring.NoFit {
		t.Fatalf("oversized headers: %v", s)
	}
}

package hostile

import (
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack"
	fe "vunet/test/frontend"
	"vunet/vhostuser"
)

// notEventfds are descriptors a front-end can hand over as kick, call or
// error fd that are not eventfds; each misbehaves on a data plane that
// accepts it (EOF forever, a blocking write, no poll support).
var notEventfds = []struct {
	name string
	make func(t *testing.T) int
}{
	{"pipe read end, writer closed", func(t *testing.T) int {
		r, w := pipe(t, false)
		unix.Close(w)
		caseFDs = caseFDs[:len(caseFDs)-1]
		return r
	}},
	{"full blocking pipe write end", func(t *testing.T) int { _, w := pipe(t, true); return w }},
	{"memfd", func(t *testing.T) int { return memfd(t, 4096) }},
	{"unix socket", func(t *testing.T) int {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		caseFDs = append(caseFDs, fds[0], fds[1])
		return fds[0]
	}},
	{"timerfd", func(t *testing.T) int {
		fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		caseFDs = append(caseFDs, fd)
		return fd
	}},
}

// TestRingFDsMustBeEventfds: a kick, call or error descriptor that is not
// an eventfd is refused (failure reply, counted as invalid) and the ring
// keeps the one it had: traffic still flows.
func TestRingFDsMustBeEventfds(t *testing.T) {
	for _, r := range []struct {
		name string
		req  fe.Request
	}{{"kick", fe.ReqSetVringKick}, {"call", fe.ReqSetVringCall}, {"err", fe.ReqSetVringErr}} {
		req := r.req
		for _, k := range notEventfds {
			t.Run(r.name+"/"+k.name, func(t *testing.T) {
				isolate(t, func(t *testing.T) {
					s := startServer(t)
					f := s.connect(t, fe.Options{})
					before := s.stats.ErrorCount(vhostuser.ErrReasonInvalid)
					// Ring 1 is pair 0's TX: its kick is what the loop
					// waits on.
					if o := try(t, f, req, u64(1), []int{k.make(t)}); o != outNack {
						t.Errorf("%s as %s fd: %v, want nack", k.name, r.name, o)
					}
					if s.stats.ErrorCount(vhostuser.ErrReasonInvalid) == before {
						t.Error("refusal not counted as invalid")
					}
					closeCaseFDs()
					exchange(t, f)
					f.Close()
					s.healthy(t)
				})
			})
		}
	}
}

// TestKickAtEOFDoesNotSpin: a kick pipe whose write end is closed is
// readable forever (EOF). Accepted, it made the event loop spin (65,609
// wakeups in 300 ms were measured); it is refused, and the loop sleeps.
func TestKickAtEOFDoesNotSpin(t *testing.T) {
	isolate(t, func(t *testing.T) {
		st := tcpstack.New(tcpstack.Config{Logger: testLogger()})
		t.Cleanup(st.Close)
		s := startServerWith(t, st)
		f := s.connect(t, fe.Options{})
		exchange(t, f)
		r, w := pipe(t, false)
		unix.Close(w)
		o := try(t, f, fe.ReqSetVringKick, u64(1), []int{r})
		closeCaseFDs()
		ps := st.PairStats(0)
		w0 := ps.Wakeups.Load()
		time.Sleep(300 * time.Millisecond)
		wakeups := ps.Wakeups.Load() - w0
		t.Logf("kick pipe at EOF: %v; %d loop wakeups in 300 ms", o, wakeups)
		if o != outNack {
			t.Errorf("kick pipe at EOF: %v, want nack", o)
		}
		// The idle loop wakes for its timers only (a few per second).
		if wakeups > 100 {
			t.Errorf("%d event loop wakeups in 300 ms of idle: spinning", wakeups)
		}
		exchange(t, f)
	})
}

// fullBlockingEventfd is an eventfd as a hostile front-end hands it over:
// O_NONBLOCK cleared on the shared file and the counter at its maximum, so
// a plain write blocks until someone reads.
func fullBlockingEventfd(t *testing.T) int {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	caseFDs = append(caseFDs, fd)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], 0xfffffffffffffffe)
	if _, err := unix.Write(fd, b[:]); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestFullBlockingEventfdsCannotHang: the front-end hands over call and
// error eventfds that are blocking and full. Writing them blocked the
// control goroutine (the call fd is signalled once when it is replaced),
// then the event loop (every interrupt, and the error fd when a queue
// breaks), so StopPair never returned and no later front-end was served.
// Signals must not block whatever the fd's flags and counter: the frames
// still flow, a broken queue is reported, the session ends, and the next
// front-end is served.
func TestFullBlockingEventfdsCannotHang(t *testing.T) {
	for _, pl := range framePlanes {
		t.Run(pl.name, func(t *testing.T) {
			isolate(t, func(t *testing.T) {
				s := startServerWith(t, pl.make(t))
				f := s.connect(t, fe.Options{})
				exchange(t, f)
				defer closeCaseFDs()
				call, errRX, errTX := fullBlockingEventfd(t), fullBlockingEventfd(t), fullBlockingEventfd(t)
				for _, m := range []struct {
					req  fe.Request
					ring uint64
					fd   int
				}{{fe.ReqSetVringErr, 0, errRX}, {fe.ReqSetVringErr, 1, errTX}, {fe.ReqSetVringCall, 0, call}} {
					if o := try(t, f, m.req, u64(m.ring), []int{m.fd}); o != outAccepted {
						t.Fatalf("%v ring %d with a full blocking eventfd: %v", m.req, m.ring, o)
					}
				}
				// The server sets O_NONBLOCK on the shared file when it
				// builds a queue; the front-end clears it again, and
				// keeps clearing it.
				stopClearing := make(chan struct{})
				cleared := make(chan struct{})
				go func() {
					defer close(cleared)
					for {
						for _, fd := range []int{call, errRX, errTX} {
							unix.SetNonblock(fd, false)
						}
						select {
						case <-stopClearing:
							return
						case <-time.After(time.Millisecond):
						}
					}
				}()
				defer func() { close(stopClearing); <-cleared }()
				time.Sleep(5 * time.Millisecond)
				// Interrupts on the full call fd: the reply arrives in
				// the used ring (polled: the call fd is ours to fill).
				p := f.Pair0()
				if err := p.PostRX(8, 2048); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 3; i++ {
					if err := p.SubmitTX(arpRequest()); err != nil {
						t.Fatal(err)
					}
					p.TX.Kick()
					deadline := time.Now().Add(5 * time.Second)
					for p.RX.PendingUsed() == 0 {
						if time.Now().After(deadline) {
							t.Fatalf("ARP reply %d never reached the used ring", i)
						}
						time.Sleep(time.Millisecond)
					}
					fr, err := p.ReceiveRX(time.Second)
					if err != nil {
						t.Fatal(err)
					}
					checkARPReply(t, fr[0].Data)
				}
				if n := s.stats.Rings[0].Notifies.Load(); n == 0 {
					t.Error("no interrupt signalled on the full call fd")
				}
				// Break the TX queue (avail index more than a ring ahead):
				// the loop signals the full error fd.
				p.TX.SetAvailIdx(p.TX.AvailIdx() + 1000)
				p.TX.Kick()
				deadline := time.Now().Add(5 * time.Second)
				for s.stats.Rings[1].ErrSignals.Load() == 0 {
					if time.Now().After(deadline) {
						t.Fatal("broken TX queue never signalled its error fd")
					}
					time.Sleep(time.Millisecond)
				}
				if err := f.Close(); err != nil {
					t.Logf("close: %v", err)
				}
				s.healthy(t)
			})
		})
	}
}

package virtqueue_test

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

// waitFD waits for fd to become readable and drains it; a timeout means a
// lost notification (the protocol must never lose one).
func waitFD(fd int) error {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(pfd, 5000)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("no notification on fd %d within 5s", fd)
		}
		var b [8]byte
		unix.Read(fd, b[:])
		return nil
	}
}

// device is an event loop in the style the data plane uses: pop with kicks
// disabled, publish one batch, re-enable, sleep on the kick eventfd.
func device(q *virtqueue.SplitQueue, kick, total int) error {
	var c virtqueue.Chain
	served := 0
	for served < total {
		q.DisableKicks()
		for {
			ok, err := q.Pop(&c)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			if len(c.Readable) != 1 || len(c.Writable) != 1 || c.ReadableLen() != 8 || c.WritableLen() != 8 {
				return fmt.Errorf("chain %d: %d/%d segments", c.Head, len(c.Readable), len(c.Writable))
			}
			seq := binary.LittleEndian.Uint64(c.Readable[0])
			binary.LittleEndian.PutUint64(c.Writable[0], seq*2+1)
			q.Push(c.Head, 8)
			served++
			if served%7 == 0 {
				q.Flush() // vary batch sizes
			}
		}
		q.Flush()
		if q.EnableKicks() || served >= total {
			continue
		}
		if err := waitFD(kick); err != nil {
			return fmt.Errorf("device after %d chains: %w", served, err)
		}
		if err := q.DrainKick(); err != nil {
			return err
		}
	}
	return nil
}

func TestConcurrentDriver(t *testing.T) {
	total := 20000
	if testing.Short() {
		total = 2000
	}
	for _, eventIdx := range []bool{false, true} {
		t.Run(fmt.Sprintf("event_idx=%v", eventIdx), func(t *testing.T) {
			r := newRig(t, rigOpt{size: 64, eventIdx: eventIdx, kick: true, call: true})
			d := r.d
			done := make(chan error, 1)
			go func() { done <- device(r.q, r.cfg.Kick, total) }()

			bufs := uint64(rigData)
			inflight := make(map[uint32]int)
			seq, completed := 0, 0
			for completed < total {
				added := false
				for seq < total && d.Free() >= 2 {
					slot := bufs + uint64(seq%64)*16
					binary.LittleEndian.PutUint64(r.g.Bytes(slot, 8), uint64(seq))
					clear(r.g.Bytes(slot+8, 8))
					h, err := d.AddChain(vqtest.Buf{GPA: slot, Len: 8}, vqtest.Buf{GPA: slot + 8, Len: 8, Write: true})
					if err != nil {
						t.Fatal(err)
					}
					inflight[uint32(h)] = seq
					seq++
					added = true
					if seq%5 == 0 {
						break // publish in small batches too
					}
				}
				if added && d.Publish(eventIdx) {
					writeEventfd(t, r.cfg.Kick, 1)
				}
				used := d.Reclaim()
				for _, u := range used {
					s, ok := inflight[u.ID]
					if !ok {
						t.Fatalf("used head %d not in flight", u.ID)
					}
					delete(inflight, u.ID)
					slot := bufs + uint64(s%64)*16
					if got := binary.LittleEndian.Uint64(r.g.Bytes(slot+8, 8)); u.Len != 8 || got != uint64(s)*2+1 {
						t.Fatalf("seq %d: used len %d, reply %d", s, u.Len, got)
					}
					if s != completed {
						t.Fatalf("completion out of order: seq %d, want %d", s, completed)
					}
					completed++
				}
				if len(used) > 0 || (seq < total && d.Free() >= 2) {
					if completed%97 == 0 {
						runtime.Gosched()
					}
					continue
				}
				// Nothing to do: ask for an interrupt, re-check, sleep.
				if eventIdx {
					d.SetUsedEvent(d.LastUsed())
				}
				if d.UsedIdx() != d.LastUsed() {
					continue
				}
				if err := waitFD(r.cfg.Call); err != nil {
					t.Fatalf("driver after %d completions: %v", completed, err)
				}
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if r.stats.Chains.Load() != uint64(total) || r.stats.UsedPublished.Load() != uint64(total) || r.stats.BadChains.Load() != 0 {
				t.Fatalf("Chains %d UsedPublished %d BadChains %d", r.stats.Chains.Load(), r.stats.UsedPublished.Load(), r.stats.BadChains.Load())
			}
			t.Logf("notifies %d suppressed %d kicks %d", r.stats.Notifies.Load(), r.stats.NotifiesSuppressed.Load(), r.stats.Kicks.Load())
		})
	}
}

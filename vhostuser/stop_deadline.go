package vhostuser

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
)

// DefaultStopTimeout is how long StopPair may take (DeviceConfig.StopTimeout)
// before the pair is abandoned. Stopping a healthy pair takes microseconds
// to milliseconds; a front-end waits for GET_VRING_BASE's reply meanwhile.
const DefaultStopTimeout = 5 * time.Second

// errStopTimeout ends a session in which a pair had to be abandoned.
var errStopTimeout = errors.New("queue pair did not stop in time")

// Nothing the front-end controls may keep a stop from returning: eventfd
// I/O never blocks (virtqueue, eventfd_io.go), and memory on a FUSE or
// network file system, whose page faults another party answers, is refused
// when mapped (virtqueue.CheckSharedFile). But a data plane touching guest
// memory can still sleep in a page fault (a local disk that stopped
// answering), or a fallback eventfd write can lose a race. So every
// StopPair gets a deadline (which cannot help against a thread asleep in
// a page fault once a garbage collection waits for it: that is why such
// memory is refused):
//
//   - Halfway, the call and error eventfds of the pair's rings are drained:
//     a loop blocked writing a full counter wakes up (an interrupt stolen
//     from a guest whose queues are being stopped is harmless; the woken
//     write adds one back).
//   - At the deadline the pair is abandoned: logged, counted as
//     errors{reason="stop_timeout"}, and the session ends (the front-end
//     is disconnected). Whatever the abandoned loop may still touch — every
//     guest memory region mapped when it was abandoned, the dirty log its
//     queues mark during a migration, and its rings' kick, call and error
//     descriptors — is neither unmapped nor closed:
//     an unmapped region would be a fault, a closed descriptor number
//     reused by another file a write to the wrong file.
//   - Across sessions (stuckPairs), the pair's index is not started again
//     and EndSession is not called (the data plane's flow state is the
//     stuck loop's) until StopPair does return. Then the kept regions are
//     unmapped and the descriptors closed.

// abandoned collects what a session kept alive for its abandoned pairs.
type abandoned struct {
	pairs []int
	done  []chan struct{}
	fds   []int
	slots []memSlot
	logs  []*virtqueue.DirtyLog // the abandoned queues may still mark them
}

// stopPairTimed runs StopPair(p) against the deadline and reports whether
// it returned; if not, the pair is abandoned and the session must end.
func (d *device) stopPairTimed(p int) bool {
	done := make(chan struct{})
	go func() {
		d.dp.StopPair(p)
		close(done)
	}()
	timeout := d.stopTimeout
	if d.gone != nil {
		// A pair of this session is stuck already, likely the others
		// for the same reason: do not wait the whole deadline for each
		// (abandoning a pair that would have stopped only delays the
		// release of what it holds).
		timeout /= 10
	}
	t := time.NewTimer(timeout / 2)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	}
	for i := 2 * p; i <= 2*p+1; i++ {
		for _, fd := range []int{d.rings[i].call, d.rings[i].errFD} {
			if fd >= 0 {
				virtqueue.ClearEventfd(fd)
			}
		}
	}
	t.Reset(timeout - timeout/2)
	select {
	case <-done:
		d.log.Warn("queue pair stopped only after its eventfds were drained", "pair", p)
		return true
	case <-t.C:
	}
	d.abandon(p, done)
	return false
}

// abandon takes pair p's descriptors out of the rings and keeps them, and
// from now on keeps every region instead of unmapping it (unmapSlots).
func (d *device) abandon(p int, done chan struct{}) {
	d.stats.countError(ErrReasonStopTimeout)
	d.log.Error("queue pair did not stop in time: abandoned; its guest memory stays mapped and its descriptors open "+
		"until it does, and the front-end is disconnected", "pair", p, "deadline", d.stopTimeout)
	if d.gone == nil {
		d.gone = &abandoned{}
	}
	d.gone.pairs = append(d.gone.pairs, p)
	d.gone.done = append(d.gone.done, done)
	for i := 2 * p; i <= 2*p+1; i++ {
		r := &d.rings[i]
		for _, fd := range []*int{&r.kick, &r.call, &r.errFD} {
			if *fd >= 0 {
				d.gone.fds = append(d.gone.fds, *fd)
				*fd = -1
			}
		}
		// The queue stays the loop's: its position is not read.
		r.q = nil
		r.started = false
	}
	// Regions that are still in the table are kept when the session
	// unmaps them (close, or a table change under way).
}

// stuckPairs are pairs of one data plane that sessions abandoned and whose
// StopPair has not returned yet. One is shared by every session of a
// Serve, Connect or ServeConn call.
type stuckPairs struct {
	mu    sync.Mutex
	pairs map[int]int // pair index → abandonments not yet returned
}

func newStuckPairs() *stuckPairs { return &stuckPairs{pairs: map[int]int{}} }

// stuck reports whether pair p (or, for p < 0, any pair) is still held
// by an abandoned loop.
func (s *stuckPairs) stuck(p int) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p < 0 {
		return len(s.pairs) > 0
	}
	return s.pairs[p] > 0
}

// keep takes over what a closing session abandoned: once every abandoned
// StopPair has returned, the regions are unmapped and the descriptors
// closed, and the pairs may start again.
func (s *stuckPairs) keep(a *abandoned, d *device) {
	s.mu.Lock()
	for _, p := range a.pairs {
		s.pairs[p]++
	}
	s.mu.Unlock()
	log := d.log
	go func() {
		for _, done := range a.done {
			<-done
		}
		for i := range a.slots {
			a.slots[i].region.Unmap()
		}
		for _, l := range a.logs {
			l.Unmap()
		}
		for _, fd := range a.fds {
			unix.Close(fd)
		}
		s.mu.Lock()
		for _, p := range a.pairs {
			if s.pairs[p]--; s.pairs[p] <= 0 {
				delete(s.pairs, p)
			}
		}
		s.mu.Unlock()
		log.Warn("abandoned queue pairs stopped at last; their guest memory and descriptors are released",
			"pairs", fmt.Sprint(a.pairs), "regions", len(a.slots))
	}()
}

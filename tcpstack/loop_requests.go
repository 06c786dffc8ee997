package tcpstack

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Requests from the control goroutine to a pair's loop. A pair's tables
// (connections, flows, forwarded ports) belong to the goroutine of its
// running loop, which takes no lock for them: a change from outside — a
// forward added or removed at run time, a look at the tables — is a
// function the loop runs between two iterations. The loop checks one
// atomic flag per iteration; the queue's mutex is taken only when there
// is something in it. While no loop runs, the caller runs the function
// itself, holding the Stack's mutex so that none starts meanwhile.

// request is one function for a pair's tables and the channel closed once
// it ran.
type request struct {
	fn   func(ps *pairState)
	done chan struct{}
}

// requestQueue is a loop's queue of requests.
type requestQueue struct {
	pending atomic.Bool
	mu      sync.Mutex
	reqs    []*request
	closed  bool // the loop has ended: post refuses
}

// post queues r; false when the loop has ended (its last drain is over).
func (q *requestQueue) post(r *request) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.reqs = append(q.reqs, r)
	q.pending.Store(true)
	return true
}

// take returns the queued requests, and with last marks the queue closed.
func (q *requestQueue) take(last bool) []*request {
	q.mu.Lock()
	defer q.mu.Unlock()
	reqs := q.reqs
	q.reqs = nil
	q.pending.Store(false)
	q.closed = q.closed || last
	return reqs
}

// runRequests runs the queued requests on the loop's goroutine; last: the
// loop is ending, and the queue takes no more.
func (l *loop) runRequests(last bool) {
	for _, r := range l.requests.take(last) {
		r.fn(l.ps)
		close(r.done)
	}
}

// onPair runs fn on pair index's tables: on its loop's goroutine when one
// runs (between two iterations), else on the caller's, with s.mu held so
// that no loop starts meanwhile. The pair's state is made if the pair has
// never run (which fails only for want of a descriptor). fn must not call
// back into the Stack's locking methods.
func (s *Stack) onPair(index int, fn func(ps *pairState)) error {
	s.mu.Lock()
	ps, err := s.pairStateLocked(index)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("pair %d: %w", index, err)
	}
	l := s.loops[index]
	if l != nil {
		r := &request{fn: fn, done: make(chan struct{})}
		if l.requests.post(r) {
			// Woken under s.mu: StopPair cannot have closed the wake fd
			// yet (it removes the loop from s.loops first).
			l.wake()
			s.mu.Unlock()
			<-r.done
			return nil
		}
		// The loop ended on its own (a fault on guest memory) and is
		// leaving: wait until it no longer touches the tables.
		<-l.done
	}
	for l := range s.stopping {
		if l.qp.Index == index {
			<-l.done // StopPair's: its shutdown still owns the tables
		}
	}
	defer s.mu.Unlock()
	fn(ps)
	return nil
}

package virtqueue

// A queue pair's interrupts in one system call.
//
// A pair's event loop often publishes used entries on both rings in one
// iteration: the TX chains it consumed and the RX frames it produced (the
// guest's data one way, our ACKs the other). Flush signalled each ring's
// call eventfd at once, an io_submit each, and each can wake the
// front-end's thread, which on a busy host preempts the loop in the middle
// of its iteration only to be woken again microseconds later by the
// second. With signals deferred, Flush only decides, and the loop sends
// what its iteration decided at the end of it, both rings in one
// io_submit: one wake-up of the front-end.

// DeferSignals with on makes Flush leave the interrupt it decides on to
// SignalPending; without, it sends what is pending and Flush signals at
// once again. The loop that defers must call SignalPending before it
// sleeps: a pending interrupt is one the guest waits for.
func (q *SplitQueue) DeferSignals(on bool) {
	if !on {
		SignalPending(q, nil)
	}
	q.deferSig = on
}

// SignalPending signals the call eventfds of a and b (either may be nil)
// that have an interrupt pending, with one io_submit when both do and
// Linux AIO is there. It never blocks.
func SignalPending(a, b *SplitQueue) {
	pa := a != nil && a.sigPending
	pb := b != nil && b.sigPending
	if pa {
		a.sigPending = false
	}
	if pb {
		b.sigPending = false
	}
	switch {
	case pa && pb && a.call >= 0 && b.call >= 0:
		ea, eb := a.efd.signalPair(a.call, &b.efd, b.call)
		a.signalFailed(a.callErr(ea))
		b.signalFailed(b.callErr(eb))
	case pa && pb:
		a.signalFailed(a.Signal())
		b.signalFailed(b.Signal())
	case pa:
		a.signalFailed(a.Signal())
	case pb:
		b.signalFailed(b.Signal())
	}
}

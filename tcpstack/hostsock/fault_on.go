//go:build vunetfault

package hostsock

import (
	"sync"

	"golang.org/x/sys/unix"
)

const faultsEnabled = true

var faults struct {
	mu    sync.Mutex
	err   [numFaultOps]unix.Errno
	times [numFaultOps]int
}

// InjectSendError makes the next times sendmsg calls of IO.Send fail with
// err instead of sending (only in builds with the vunetfault tag). It
// returns a function that cancels what is left of it.
func InjectSendError(err unix.Errno, times int) (cancel func()) { return inject(faultSend, err, times) }

// InjectedSendErrorsLeft is how many injected sendmsg errors are still to
// come.
func InjectedSendErrorsLeft() int { return injectedLeft(faultSend) }

// InjectPeekError makes the next times IO.Peek calls fail with err
// instead of peeking (only in builds with the vunetfault tag). It returns
// a function that cancels what is left of it.
func InjectPeekError(err unix.Errno, times int) (cancel func()) { return inject(faultPeek, err, times) }

// InjectedPeekErrorsLeft is how many injected peek errors are still to
// come.
func InjectedPeekErrorsLeft() int { return injectedLeft(faultPeek) }

func injectedLeft(op faultOp) int {
	faults.mu.Lock()
	defer faults.mu.Unlock()
	return faults.times[op]
}

func inject(op faultOp, err unix.Errno, times int) func() {
	faults.mu.Lock()
	faults.err[op], faults.times[op] = err, times
	faults.mu.Unlock()
	return func() {
		faults.mu.Lock()
		faults.times[op] = 0
		faults.mu.Unlock()
	}
}

func injectedFault(op faultOp) error {
	faults.mu.Lock()
	defer faults.mu.Unlock()
	if faults.times[op] <= 0 {
		return nil
	}
	faults.times[op]--
	return faults.err[op]
}

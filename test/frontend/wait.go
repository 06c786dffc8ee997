package frontend

import "time"

// waitUntil polls cond every millisecond: raw tests use it where the driver
// bookkeeping that WaitCall relies on has been bypassed.
func waitUntil(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return ErrTimeout
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

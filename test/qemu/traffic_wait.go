package qemu

import (
	"fmt"
	"time"
)

// WaitEchoConns waits until the server has accepted n ECHO connections and
// returns their accept times.
func (s *TrafficServer) WaitEchoConns(n int, timeout time.Duration) ([]time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		acc, _ := s.EchoConns()
		if len(acc) >= n {
			return acc, nil
		}
		if time.Now().After(deadline) {
			return acc, fmt.Errorf("%d ECHO connections after %v, want %d", len(acc), timeout, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitEchoConnAfter waits up to timeout for an ECHO connection accepted
// after t0 and returns when the first one was.
func (s *TrafficServer) WaitEchoConnAfter(t0 time.Time, timeout time.Duration) (time.Time, error) {
	deadline := t0.Add(timeout)
	for {
		acc, _ := s.EchoConns()
		for _, a := range acc {
			if a.After(t0) {
				return a, nil
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("no ECHO connection in the %v after %v (%d before)", timeout, t0.Format("15:04:05.000"), len(acc))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

package qemu

import (
	"bufio"
	"fmt"
	"net"
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

// longEcho is how many reads make an ECHO connection a held one, whose
// silences LongestEchoGap reports (the tcploop check's connections echo
// once).
const longEcho = 10

// echoTimed echoes everything until EOF and returns the longest time
// between two reads and how many reads there were.
func echoTimed(c net.Conn, br *bufio.Reader) (gap time.Duration, reads int) {
	buf := make([]byte, 64<<10)
	var last time.Time
	for {
		n, err := br.Read(buf)
		if n > 0 {
			now := time.Now()
			if !last.IsZero() {
				gap = max(gap, now.Sub(last))
			}
			last = now
			reads++
			if _, werr := c.Write(buf[:n]); werr != nil {
				return gap, reads
			}
		}
		if err != nil {
			return gap, reads
		}
	}
}

// LongestEchoGap returns, on the host's clock, the longest silence of the
// held ECHO connections that have ended (at least longEcho reads): the
// time between two consecutive bytes the server read on one of them.
func (s *TrafficServer) LongestEchoGap() (gap time.Duration, echoes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.echoGap.gap, s.echoGap.echoes
}

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
// silences HeldEchoGaps reports (the tcploop check's connections echo
// once).
const longEcho = 10

// echoTimed echoes everything until EOF and returns when each read was.
func echoTimed(c net.Conn, br *bufio.Reader) (reads []time.Time) {
	buf := make([]byte, 64<<10)
	for {
		n, err := br.Read(buf)
		if n > 0 {
			reads = append(reads, time.Now())
			if _, werr := c.Write(buf[:n]); werr != nil {
				return reads
			}
		}
		if err != nil {
			return reads
		}
	}
}

// EchoGaps is what HeldEchoGaps reports, on the host's clock.
type EchoGaps struct {
	Echoes  int           // reads on the held connection
	Longest time.Duration // its longest silence: time between two reads
	Across  time.Duration // the silence that contains the instant asked about (0: none did)
}

// HeldEchoGaps reports on the held ECHO connection that has ended (the
// one with the most reads): its longest silence, and the silence that
// spans at: the time between the last read before it and the first after.
func (s *TrafficServer) HeldEchoGaps(at time.Time) (g EchoGaps) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var reads []time.Time
	for _, r := range s.heldEchoes {
		if len(r) > len(reads) {
			reads = r
		}
	}
	g.Echoes = len(reads)
	for i := 1; i < len(reads); i++ {
		d := reads[i].Sub(reads[i-1])
		g.Longest = max(g.Longest, d)
		if !reads[i-1].After(at) && reads[i].After(at) {
			g.Across = d
		}
	}
	return g
}

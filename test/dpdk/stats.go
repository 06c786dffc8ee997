package dpdk

import (
	"bufio"
	"regexp"
	"strconv"
	"strings"
)

// PortStats are one port's counters from testpmd's "Forward statistics for
// port N" block, printed when forwarding stops.
type PortStats struct {
	RXPackets, RXDropped, TXPackets, TXDropped uint64
}

var (
	fwdHeader = regexp.MustCompile(`Forward statistics for port (\d+)`)
	fwdRX     = regexp.MustCompile(`RX-packets:\s*(\d+)\s+RX-dropped:\s*(\d+)`)
	fwdTX     = regexp.MustCompile(`TX-packets:\s*(\d+)\s+TX-dropped:\s*(\d+)`)
)

// ParseForwardStats returns, per port number, the last forward statistics
// block in testpmd's output.
func ParseForwardStats(out string) map[int]PortStats {
	stats := map[int]PortStats{}
	port := -1
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := fwdHeader.FindStringSubmatch(line); m != nil {
			port, _ = strconv.Atoi(m[1])
			stats[port] = PortStats{}
			continue
		}
		if port < 0 {
			continue
		}
		s := stats[port]
		if m := fwdRX.FindStringSubmatch(line); m != nil {
			s.RXPackets, _ = strconv.ParseUint(m[1], 10, 64)
			s.RXDropped, _ = strconv.ParseUint(m[2], 10, 64)
		} else if m := fwdTX.FindStringSubmatch(line); m != nil {
			s.TXPackets, _ = strconv.ParseUint(m[1], 10, 64)
			s.TXDropped, _ = strconv.ParseUint(m[2], 10, 64)
			stats[port] = s
			port = -1 // TX closes the block
			continue
		}
		stats[port] = s
	}
	return stats
}

package load

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// The flood targets: prefixes the back-end's network namespace owns (see
// OwnPrefixes), never an outside address. LocalPrefix holds local
// addresses nothing listens on (connections are refused at once, UDP is
// answered by port unreachable); SilentPrefix is routed to SilentHop, a
// neighbour on the rig's link that never answers (connections wait until
// the neighbour is given up, about 3 s).
const (
	LocalPrefix  = "10.214.0.0/16"
	SilentPrefix = "10.215.0.0/16"
	SilentHop    = "10.213.0.250"
	// SilentDev is the back-end namespace's interface SilentHop is on.
	SilentDev = "rig0"
)

// OwnPrefixes routes the flood prefixes in the back-end's namespace; run
// runs a command there (rig.HostExec).
func OwnPrefixes(run func(name string, args ...string) error) error {
	for _, args := range [][]string{
		{"route", "add", "local", LocalPrefix, "dev", "lo"},
		{"route", "add", SilentPrefix, "via", SilentHop, "dev", SilentDev},
	} {
		if err := run("ip", args...); err != nil {
			return fmt.Errorf("own the flood prefixes: %w", err)
		}
	}
	return nil
}

// PrefixAddr is the i-th address of an IPv4 /16 (skipping .0 and .255).
func PrefixAddr(prefix string, i int) netip.Addr {
	b := netip.MustParsePrefix(prefix).Addr().As4()
	b[2], b[3] = byte(i/254), byte(1+i%254)
	return netip.AddrFrom4(b)
}

// SYNFlood sends n SYNs at rate a second to n distinct destinations: the
// first half in SilentPrefix (they hold a connection each until the
// neighbour is given up), the second half in LocalPrefix (refused at
// once), each to its own port, from source ports srcBase on.
func (f *Flooder) SYNFlood(n, rate int, srcBase uint16) (int, error) {
	return f.Paced(n, rate, func(i int) []byte {
		prefix := SilentPrefix
		if i >= n/2 {
			prefix = LocalPrefix
		}
		dst := netip.AddrPortFrom(PrefixAddr(prefix, i%max(n/2, 1)), uint16(1000+i))
		return f.SYN(dst, srcBase+uint16(i), uint32(i)*7919)
	})
}

// UDPFlood sends n datagrams at rate a second from one source port to n
// ports of a LocalPrefix address, from port 1000 on (below it is 67,
// which the back-end's DHCP server takes): each a new flow.
func (f *Flooder) UDPFlood(n, rate int) (int, error) {
	dst := PrefixAddr(LocalPrefix, 0)
	return f.Paced(n, rate, func(i int) []byte {
		return f.UDP(netip.AddrPortFrom(dst, uint16(1000+i)), 33333, 32)
	})
}

// FragFlood sends, at rate frames a second, overlapping datagrams of two
// fragments each ([0, 1000) then [504, 1504)) and then incomplete
// datagrams of one fragment each, IP identifications from id0 on: 2 ×
// overlapping + incomplete frames, nothing ever reassembled.
func (f *Flooder) FragFlood(overlapping, incomplete, rate int, id0 uint16) (int, error) {
	dst := netip.AddrPortFrom(PrefixAddr(LocalPrefix, 1), 9)
	return f.Paced(2*overlapping+incomplete, rate, func(i int) []byte {
		if k := i / 2; k < overlapping {
			if i%2 == 0 {
				return f.Fragment(dst, id0+uint16(k), 0, 1000, 3000, true)
			}
			return f.Fragment(dst, id0+uint16(k), 504, 1000, 3000, true)
		}
		return f.Fragment(dst, id0+uint16(i-overlapping), 0, 1000, 3000, true)
	})
}

// LinkFlood sends perKind ARP requests, Neighbor Solicitations and
// DHCPDISCOVERs, interleaved, at rate of each a second; tag goes into the
// DHCP transaction ids.
func (f *Flooder) LinkFlood(perKind, rate int, tag uint8) (int, error) {
	return f.Paced(3*perKind, 3*rate, func(i int) []byte {
		switch i % 3 {
		case 0:
			return f.ARP(PrefixAddr("10.216.0.0/16", i/3))
		case 1:
			a := netip.MustParseAddr("fd00:216::1").As16()
			a[14], a[15] = byte(i/3>>8), byte(i/3)
			return f.NeighborSolicit(netip.AddrFrom16(a))
		}
		return f.DHCPDiscover(uint32(tag)<<24 | uint32(i))
	})
}

// ProcStatusKB reads a "kB" field of /proc/PID/status (VmRSS, RssAnon,
// RssShmem, …); -1 when it cannot.
func ProcStatusKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// ProcFDs counts a process's open descriptors; -1 when it cannot.
func ProcFDs(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(es)
}

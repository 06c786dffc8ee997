package dgram

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// ErrPingRefused reports that the host refuses unprivileged ICMP echo
// sockets to this process: net.ipv4.ping_group_range (per network namespace,
// "1 0" by default) does not include its group.
var ErrPingRefused = errors.New("ping sockets refused: widen net.ipv4.ping_group_range to include this process's group")

// ProbePingSockets opens and closes one ICMP echo socket per family, so the
// daemon can say at start-up — once, instead of per guest ping — that guest
// pings will go unanswered. v6 is nil when IPv6 is unavailable altogether.
func ProbePingSockets() (v4, v6 error) {
	probe := func(family, proto int) error {
		fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, proto)
		switch {
		case err == nil:
			unix.Close(fd)
			return nil
		case errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM):
			return ErrPingRefused
		case family == unix.AF_INET6 && errors.Is(err, unix.EAFNOSUPPORT):
			return nil
		}
		return fmt.Errorf("ping socket: %w", err)
	}
	return probe(unix.AF_INET, unix.IPPROTO_ICMP), probe(unix.AF_INET6, unix.IPPROTO_ICMPV6)
}

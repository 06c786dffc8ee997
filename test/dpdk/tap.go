package dpdk

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// tapSocket is an AF_PACKET socket on the TAP device: what it sends goes to
// testpmd (and on to vunet), what testpmd writes to the TAP it receives.
type tapSocket struct {
	fd      int
	ifindex int
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func openTapSocket(iface string) (*tapSocket, error) {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", iface, err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind packet socket to %s: %w", iface, err)
	}
	return &tapSocket{fd: fd, ifindex: ifi.Index}, nil
}

func (s *tapSocket) Close() error { return unix.Close(s.fd) }

func (s *tapSocket) send(frame []byte) error {
	sa := &unix.SockaddrLinklayer{Ifindex: s.ifindex, Halen: 6}
	copy(sa.Addr[:], frame[:6])
	return unix.Sendto(s.fd, frame, 0, sa)
}

// recvIncoming waits up to d for a frame coming from testpmd; our own
// transmissions, which packet sockets also see, are skipped.
func (s *tapSocket) recvIncoming(buf []byte, d time.Duration) (int, error) {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return 0, os.ErrDeadlineExceeded
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		if err := unix.SetsockoptTimeval(s.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return 0, err
		}
		n, from, err := unix.Recvfrom(s.fd, buf, 0)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		return n, nil
	}
}

// setUpNoIPv6 brings iface up with IPv6 off, so the kernel adds no router
// solicitations or MLD reports of its own to what the test counts.
func setUpNoIPv6(iface string) error {
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+iface+"/disable_ipv6", []byte("1"), 0)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(iface)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get flags of %s: %w", iface, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set %s up: %w", iface, err)
	}
	return nil
}

func arpRequest(src net.HardwareAddr, spa, tpa net.IP) []byte {
	f := make([]byte, 42)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], unix.ETH_P_ARP)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:2], 1)
	binary.BigEndian.PutUint16(a[2:4], unix.ETH_P_IP)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:8], 1)
	copy(a[8:14], src)
	copy(a[14:18], spa.To4())
	copy(a[24:28], tpa.To4())
	return f
}

// arpReply is a decoded ARP reply.
type arpReply struct {
	ethDst, sha, tha net.HardwareAddr
	spa, tpa         net.IP
}

func parseARPReply(f []byte) (arpReply, bool) {
	if len(f) < 42 || binary.BigEndian.Uint16(f[12:14]) != unix.ETH_P_ARP {
		return arpReply{}, false
	}
	a := f[14:]
	if binary.BigEndian.Uint16(a[6:8]) != 2 || a[4] != 6 || a[5] != 4 {
		return arpReply{}, false
	}
	c := func(b []byte) []byte { return append([]byte(nil), b...) }
	return arpReply{
		ethDst: c(f[0:6]), sha: c(a[8:14]), spa: c(a[14:18]), tha: c(a[18:24]), tpa: c(a[24:28]),
	}, true
}

func probeFrame(src net.HardwareAddr, etherType uint16, seq int) []byte {
	f := make([]byte, 60)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], etherType)
	copy(f[14:], fmt.Sprintf("VUNET-PROBE %d", seq))
	return f
}

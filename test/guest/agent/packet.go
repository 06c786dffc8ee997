package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/guest"
)

// packetConn is an AF_PACKET socket on one interface: the link and ARP
// checks need to put exact frames on the wire before any IP configuration.
type packetConn struct {
	fd      int
	ifindex int
	mac     net.HardwareAddr
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func openPacket(iface string, proto uint16) (*packetConn, error) {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", iface, err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(proto)))
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	sa := &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: ifi.Index}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind packet socket to %s: %w", iface, err)
	}
	return &packetConn{fd: fd, ifindex: ifi.Index, mac: ifi.HardwareAddr}, nil
}

func (c *packetConn) Close() error { return unix.Close(c.fd) }

func (c *packetConn) send(frame []byte) error {
	sa := &unix.SockaddrLinklayer{Ifindex: c.ifindex, Halen: 6}
	copy(sa.Addr[:], frame[0:6])
	return unix.Sendto(c.fd, frame, 0, sa)
}

// recv waits at most d for one frame.
func (c *packetConn) recv(buf []byte, d time.Duration) (int, error) {
	tv := unix.NsecToTimeval(d.Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, fmt.Errorf("set receive timeout: %w", err)
	}
	n, _, err := unix.Recvfrom(c.fd, buf, 0)
	return n, err
}

var broadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// probeFrame builds a broadcast frame of guest.ProbeEtherType carrying payload.
func probeFrame(src net.HardwareAddr, payload []byte) []byte {
	f := make([]byte, 14+len(payload))
	copy(f[0:6], broadcastMAC)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], guest.ProbeEtherType)
	copy(f[14:], payload)
	return f
}

func arpRequestFrame(src net.HardwareAddr, spa, tpa net.IP) []byte {
	f := make([]byte, 42)
	copy(f[0:6], broadcastMAC)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], unix.ETH_P_ARP)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:2], 1) // Ethernet
	binary.BigEndian.PutUint16(a[2:4], unix.ETH_P_IP)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:8], 1) // request
	copy(a[8:14], src)
	copy(a[14:18], spa.To4())
	copy(a[24:28], tpa.To4())
	return f
}

// parseARPReply returns the sender of an ARP reply frame.
func parseARPReply(f []byte) (sha net.HardwareAddr, spa net.IP, ok bool) {
	if len(f) < 42 || binary.BigEndian.Uint16(f[12:14]) != unix.ETH_P_ARP {
		return nil, nil, false
	}
	a := f[14:]
	if binary.BigEndian.Uint16(a[0:2]) != 1 || binary.BigEndian.Uint16(a[2:4]) != unix.ETH_P_IP ||
		a[4] != 6 || a[5] != 4 || binary.BigEndian.Uint16(a[6:8]) != 2 {
		return nil, nil, false
	}
	return net.HardwareAddr(append([]byte(nil), a[8:14]...)), net.IP(append([]byte(nil), a[14:18]...)), true
}

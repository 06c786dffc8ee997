package load

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
)

// Flooder writes hand-made frames into the guest's interface from inside
// the guest's network namespace, through an AF_PACKET socket bound to it:
// they leave the interface like the guest kernel's own, so they reach the
// back-end as guest transmissions (SYNs the guest kernel never made, UDP
// to thousands of ports, fragments that overlap or never complete, ARP,
// NDP and DHCP requests). Frames are sent at a given rate; what the
// interface could not queue is its own counter (tx_dropped).
type Flooder struct {
	fd       int
	src, dst header.MAC
	guest4   netip.Addr
	guestLL  netip.Addr // the guest's IPv6 link-local address (EUI-64 of src)
	ipID     uint16
	buf      [2048]byte
}

// NewFlooder opens the packet socket on interface ifname of the namespace
// inGuest enters. dst is the back-end's MAC (the guest's next hop), guest4
// the guest's IPv4 address, the source of the IPv4 frames.
func NewFlooder(inGuest func(func() error) error, ifname string, dst header.MAC, guest4 netip.Addr) (*Flooder, error) {
	f := &Flooder{fd: -1, dst: dst, guest4: guest4}
	err := inGuest(func() error {
		ifc, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		if len(ifc.HardwareAddr) != 6 {
			return fmt.Errorf("%s: no Ethernet address", ifname)
		}
		copy(f.src[:], ifc.HardwareAddr)
		proto := int(htons(unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		// Nothing is read from it: no receive queue worth keeping.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4096)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifc.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind packet socket to %s: %w", ifname, err)
		}
		f.fd = fd
		return nil
	})
	if err != nil {
		return nil, err
	}
	ll := [16]byte{0xfe, 0x80, 8: f.src[0] ^ 2, 9: f.src[1], 10: f.src[2], 11: 0xff, 12: 0xfe, 13: f.src[3], 14: f.src[4], 15: f.src[5]}
	f.guestLL = netip.AddrFrom16(ll)
	return f, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Close closes the packet socket.
func (f *Flooder) Close() error {
	if f.fd < 0 {
		return nil
	}
	err := unix.Close(f.fd)
	f.fd = -1
	return err
}

// Paced calls frame(i) for i in [0, n) and sends each frame it builds (a
// nil frame is skipped) at rate frames a second (0: as fast as the socket
// takes them). It returns the frames sent; a send error ends it.
func (f *Flooder) Paced(n, rate int, frame func(i int) []byte) (int, error) {
	start := time.Now()
	sent := 0
	for i := 0; i < n; i++ {
		if rate > 0 {
			due := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
		}
		b := frame(i)
		if b == nil {
			continue
		}
		if _, err := unix.Write(f.fd, b); err != nil {
			return sent, fmt.Errorf("send frame %d: %w", i, err)
		}
		sent++
	}
	return sent, nil
}

// ipv4 writes Ethernet and IPv4 headers for a payload of plen bytes and
// returns the offset of the payload. fragOff is in bytes; more sets MF.
func (f *Flooder) ipv4(dst netip.Addr, proto header.IPProtocol, plen int, id uint16, fragOff int, more bool) int {
	b := f.buf[:]
	off := header.EncodeEthernet(b, f.dst, f.src, header.EtherTypeIPv4)
	var flags uint16
	if more {
		flags = header.IPv4FlagMoreFragments
	}
	off += header.EncodeIPv4(b[off:], &header.IPv4Fields{TotalLength: uint16(header.IPv4MinimumSize + plen), ID: id,
		Flags: flags, FragmentOffset: uint16(fragOff), TTL: 64, Protocol: proto, Source: f.guest4, Destination: dst})
	return off
}

func (f *Flooder) nextID() uint16 {
	f.ipID++
	return f.ipID
}

// SYN builds a TCP SYN from the guest's srcPort to dst. The frame is valid
// until the next build.
func (f *Flooder) SYN(dst netip.AddrPort, srcPort uint16, seq uint32) []byte {
	var opts [4]byte
	on := header.EncodeTCPOptions(opts[:], &header.TCPOptions{HasMSS: true, MSS: 1460})
	tl := header.TCPMinimumSize + on
	off := f.ipv4(dst.Addr(), header.IPProtocolTCP, tl, f.nextID(), 0, false)
	header.EncodeTCP(f.buf[off:], &header.TCPFields{SrcPort: srcPort, DstPort: dst.Port(), SeqNum: seq,
		Flags: header.TCPFlagSYN, WindowSize: 65535, Options: opts[:on]})
	header.TCP(f.buf[off:off+tl]).SetChecksum(f.guest4, dst.Addr())
	return f.buf[:off+tl]
}

// UDP builds a UDP datagram of n payload bytes from the guest's srcPort to
// dst.
func (f *Flooder) UDP(dst netip.AddrPort, srcPort uint16, n int) []byte {
	ul := header.UDPMinimumSize + n
	off := f.ipv4(dst.Addr(), header.IPProtocolUDP, ul, f.nextID(), 0, false)
	header.EncodeUDP(f.buf[off:], srcPort, dst.Port(), uint16(ul))
	for i := range n {
		f.buf[off+header.UDPMinimumSize+i] = byte(i)
	}
	header.UDP(f.buf[off:off+ul]).SetChecksum(f.guest4, dst.Addr())
	return f.buf[:off+ul]
}

// Fragment builds one IPv4 fragment of a UDP datagram to dst: n bytes at
// byte offset off (a multiple of 8) of datagram id, more saying whether
// fragments follow. The bytes are a pattern; a fragment at offset 0 starts
// with a UDP header for a datagram of total bytes.
func (f *Flooder) Fragment(dst netip.AddrPort, id uint16, off, n, total int, more bool) []byte {
	p := f.ipv4(dst.Addr(), header.IPProtocolUDP, n, id, off, more)
	for i := range n {
		f.buf[p+i] = byte(off + i)
	}
	if off == 0 && n >= header.UDPMinimumSize {
		header.EncodeUDP(f.buf[p:], 40000, dst.Port(), uint16(total))
	}
	return f.buf[:p+n]
}

// ARP builds an ARP request from the guest for target.
func (f *Flooder) ARP(target netip.Addr) []byte {
	b := f.buf[:]
	off := header.EncodeEthernet(b, header.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, f.src, header.EtherTypeARP)
	off += header.EncodeARP(b[off:], header.ARPRequest, f.src, f.guest4, header.MAC{}, target)
	return b[:off]
}

// NeighborSolicit builds an NDP Neighbor Solicitation from the guest's
// link-local address for target, to target's solicited-node group.
func (f *Flooder) NeighborSolicit(target netip.Addr) []byte {
	group := header.SolicitedNodeMulticast(target)
	b := f.buf[:]
	off := header.EncodeEthernet(b, header.IPv6MulticastMAC(group.As16()), f.src, header.EtherTypeIPv6)
	const icmpLen = header.ICMPv6HeaderSize + header.NDPNeighborSolicitMinimumSize + 8
	off += header.EncodeIPv6(b[off:], &header.IPv6Fields{PayloadLength: icmpLen, NextHeader: header.IPProtocolICMPv6,
		HopLimit: header.NDPHopLimit, Source: f.guestLL, Destination: group})
	icmp := b[off : off+icmpLen]
	header.EncodeNDPNeighborSolicit(icmp, target)
	header.EncodeNDPLinkLayerOption(icmp[icmpLen-8:], header.NDPOptSourceLinkLayer, f.src)
	header.ICMPv6(icmp).SetChecksum(f.guestLL, group)
	return b[:off+icmpLen]
}

// DHCPDiscover builds a DHCPDISCOVER with transaction id xid, broadcast
// from 0.0.0.0 as a client without an address sends it.
func (f *Flooder) DHCPDiscover(xid uint32) []byte {
	const bootp = 236 + 4 + 3 + 1 // fixed part, magic cookie, message type, end
	ul := header.UDPMinimumSize + bootp
	b := f.buf[:]
	off := header.EncodeEthernet(b, header.MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, f.src, header.EtherTypeIPv4)
	bcast := netip.AddrFrom4([4]byte{255, 255, 255, 255})
	off += header.EncodeIPv4(b[off:], &header.IPv4Fields{TotalLength: uint16(header.IPv4MinimumSize + ul), ID: f.nextID(),
		TTL: 64, Protocol: header.IPProtocolUDP, Source: netip.IPv4Unspecified(), Destination: bcast})
	header.EncodeUDP(b[off:], header.DHCPv4ClientPort, header.DHCPv4ServerPort, uint16(ul))
	m := b[off+header.UDPMinimumSize : off+ul]
	clear(m)
	m[0], m[1], m[2] = 1, 1, 6 // BOOTREQUEST, Ethernet, 6-byte addresses
	binary.BigEndian.PutUint32(m[4:8], xid)
	copy(m[28:34], f.src[:])
	copy(m[236:240], []byte{99, 130, 83, 99})
	m[240], m[241], m[242] = 53, 1, 1 // DHCP message type: DISCOVER
	m[243] = 255
	header.UDP(b[off:off+ul]).SetChecksum(netip.IPv4Unspecified(), bcast)
	return b[:off+ul]
}

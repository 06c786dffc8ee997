package header

import (
	"encoding/binary"
	"net/netip"
)

// ARPSize is the length of an ARP packet for IPv4 over Ethernet (RFC 826).
const ARPSize = 28

// ARPOp is the ARP operation code.
type ARPOp uint16

// ARP and RARP (RFC 903) operations.
const (
	ARPRequest  ARPOp = 1
	ARPReply    ARPOp = 2
	RARPRequest ARPOp = 3
	RARPReply   ARPOp = 4
)

// ARP is a view of an IPv4-over-Ethernet ARP packet.
type ARP []byte

// ParseARP validates that b holds an IPv4-over-Ethernet ARP packet (hardware
// type 1, protocol 0x0800, address lengths 6 and 4). Other variants return
// ErrNotSupported: the guest link only carries those.
func ParseARP(b []byte) (ARP, error) {
	if len(b) < ARPSize {
		return nil, ErrTruncated
	}
	if binary.BigEndian.Uint16(b[0:2]) != 1 || binary.BigEndian.Uint16(b[2:4]) != uint16(EtherTypeIPv4) || b[4] != 6 || b[5] != 4 {
		return nil, ErrNotSupported
	}
	return ARP(b[:ARPSize]), nil
}

// Op returns the operation.
func (a ARP) Op() ARPOp { return ARPOp(binary.BigEndian.Uint16(a[6:8])) }

// SenderMAC returns the sender hardware address.
func (a ARP) SenderMAC() MAC { return MAC(a[8:14]) }

// SenderIP returns the sender protocol address.
func (a ARP) SenderIP() netip.Addr { return netip.AddrFrom4([4]byte(a[14:18])) }

// TargetMAC returns the target hardware address.
func (a ARP) TargetMAC() MAC { return MAC(a[18:24]) }

// TargetIP returns the target protocol address.
func (a ARP) TargetIP() netip.Addr { return netip.AddrFrom4([4]byte(a[24:28])) }

// EncodeARP writes an IPv4-over-Ethernet ARP packet into b and returns
// ARPSize, or 0 when b is too short.
func EncodeARP(b []byte, op ARPOp, senderMAC MAC, senderIP netip.Addr, targetMAC MAC, targetIP netip.Addr) int {
	if len(b) < ARPSize {
		return 0
	}
	binary.BigEndian.PutUint16(b[0:2], 1)
	binary.BigEndian.PutUint16(b[2:4], uint16(EtherTypeIPv4))
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:8], uint16(op))
	s, t := as4(senderIP), as4(targetIP)
	copy(b[8:14], senderMAC[:])
	copy(b[14:18], s[:])
	copy(b[18:24], targetMAC[:])
	copy(b[24:28], t[:])
	return ARPSize
}

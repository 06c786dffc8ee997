// Package guestframe builds the frames a guest sends, for the tests of the
// data path's packages (tcpstack and its subpackages build their inputs
// here instead of each keeping a copy). It is test support: it panics on
// misuse and imports only tcpstack/header.
package guestframe

import (
	"net/netip"

	"vunet/tcpstack/header"
)

// The guest's and our link-layer identities in the frames built here.
var (
	GuestMAC = header.MAC{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	OurMAC   = header.MAC{0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55}
	// GuestLL is the guest's link-local address (EUI-64 of GuestMAC).
	GuestLL = netip.MustParseAddr("fe80::5054:ff:fe12:3456")
)

// Frame wraps an upper-layer message l4 (checksummed already) in an IPv4 or
// IPv6 header, dst's family, with hop limit (TTL) hopLimit, and an Ethernet
// header from GuestMAC to dstMAC.
func Frame(dstMAC header.MAC, src, dst netip.Addr, proto header.IPProtocol, hopLimit uint8, l4 []byte) []byte {
	ipLen, et := header.IPv4MinimumSize, header.EtherTypeIPv4
	if !dst.Is4() {
		ipLen, et = header.IPv6MinimumSize, header.EtherTypeIPv6
	}
	b := make([]byte, header.EthernetMinimumSize+ipLen, header.EthernetMinimumSize+ipLen+len(l4))
	header.EncodeEthernet(b, dstMAC, GuestMAC, et)
	ip := b[header.EthernetMinimumSize:]
	if dst.Is4() {
		header.EncodeIPv4(ip, &header.IPv4Fields{TotalLength: uint16(ipLen + len(l4)), TTL: hopLimit,
			Protocol: proto, Source: src, Destination: dst})
	} else {
		header.EncodeIPv6(ip, &header.IPv6Fields{PayloadLength: uint16(len(l4)), NextHeader: proto,
			HopLimit: hopLimit, Source: src, Destination: dst})
	}
	return append(b, l4...)
}

// UDP returns a UDP datagram with its checksum.
func UDP(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	u := make([]byte, header.UDPMinimumSize+len(payload))
	header.EncodeUDP(u, sport, dport, uint16(len(u)))
	copy(u[header.UDPMinimumSize:], payload)
	header.UDP(u).SetChecksum(src, dst)
	return u
}

// Opt is a raw DHCPv4 option: code, length, data.
func Opt(code byte, data ...byte) []byte { return append([]byte{code, byte(len(data))}, data...) }

// DHCP returns a DHCPv4 client frame of message type mt (xid 0xdeadbeef,
// chaddr GuestMAC) with flags and, when not "", ciaddr; opts (see Opt)
// follow the message type. It is broadcast, from ciaddr or 0.0.0.0.
func DHCP(mt header.DHCPv4MessageType, flags uint16, ciaddr string, opts ...[]byte) []byte {
	f := header.DHCPv4Fields{Op: header.DHCPv4OpRequest, TransactionID: 0xdeadbeef, Flags: flags, ClientMAC: GuestMAC}
	src := netip.IPv4Unspecified()
	if ciaddr != "" {
		f.ClientIP = netip.MustParseAddr(ciaddr)
		src = f.ClientIP
	}
	b := make([]byte, 1500)
	var w header.DHCPv4Builder
	w.Reset(b, &f)
	w.AddOptionByte(header.DHCPv4OptMessageType, uint8(mt))
	for _, o := range opts {
		w.AddOption(o[0], o[2:2+o[1]])
	}
	n, ok := w.Finish()
	if !ok {
		panic("guestframe: DHCP message does not fit")
	}
	dst := netip.MustParseAddr("255.255.255.255")
	return Frame(header.BroadcastMAC, src, dst, header.IPProtocolUDP, 64,
		UDP(src, dst, header.DHCPv4ClientPort, header.DHCPv4ServerPort, b[:n]))
}

// DHCPv6 returns a DHCPv6 client frame carrying msg, from GuestLL to
// All_DHCP_Relay_Agents_and_Servers, hop limit 1.
func DHCPv6(msg []byte) []byte {
	dst := header.IPv6AllDHCPRelayAgentsAndServers
	return Frame(header.IPv6MulticastMAC(dst.As16()), GuestLL, dst, header.IPProtocolUDP, 1,
		UDP(GuestLL, dst, header.DHCPv6ClientPort, header.DHCPv6ServerPort, msg))
}

// NS returns a Neighbor Solicitation from src for target, to target's
// solicited-node group, with or without a source link-layer option.
func NS(src, target netip.Addr, sll bool) []byte {
	m := make([]byte, 64)
	n := header.EncodeNDPNeighborSolicit(m, target)
	if sll {
		n += header.EncodeNDPLinkLayerOption(m[n:], header.NDPOptSourceLinkLayer, GuestMAC)
	}
	dst := header.SolicitedNodeMulticast(target)
	header.ICMPv6(m[:n]).SetChecksum(src, dst)
	return Frame(header.IPv6MulticastMAC(dst.As16()), src, dst, header.IPProtocolICMPv6, header.NDPHopLimit, m[:n])
}

// TCP returns a guest TCP segment from src to dst with the fields of f (its
// ports are src's and dst's; options padded to whole words) and payload,
// checksummed, in a frame from GuestMAC to OurMAC with hop limit 64.
func TCP(src, dst netip.AddrPort, f header.TCPFields, payload []byte) []byte {
	f.SrcPort, f.DstPort = src.Port(), dst.Port()
	tcpLen := header.TCPMinimumSize + (len(f.Options)+3)/4*4
	l4 := make([]byte, tcpLen+len(payload))
	header.EncodeTCP(l4, &f)
	copy(l4[tcpLen:], payload)
	header.TCP(l4).SetChecksum(src.Addr(), dst.Addr())
	return Frame(OurMAC, src.Addr(), dst.Addr(), header.IPProtocolTCP, 64, l4)
}

// Pattern is n bytes of a repeating, non-trivial pattern: data whose
// reordering, loss or duplication shows in a byte comparison.
func Pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

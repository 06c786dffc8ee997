package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"vunet/test/guest"
)

// Source ports (TCP, UDP) and echo identifiers (ICMP) of the policy
// check's probes: probe i uses policyProbeBase+i, so answers can be told
// apart from the guest kernel's own traffic.
const policyProbeBase = 47000

// checkPolicy probes the back-end's address policy (see guest.CheckPolicy).
func (a *agent) checkPolicy(ctx context.Context) guest.Result {
	port, err := strconv.Atoi(a.params.Values[guest.ParamPolicyPort])
	if err != nil || port <= 0 || port > 65535 {
		return fail("%s=%q: want a port", guest.ParamPolicyPort, a.params.Values[guest.ParamPolicyPort])
	}
	gw, ok := netip.AddrFromSlice(net.ParseIP(firstWord(a.lease["router"])).To4())
	src4, ok4 := netip.AddrFromSlice(ifaceIPv4(ifName).To4())
	if !ok || !ok4 {
		return fail("no DHCP router or address: run the dhcp check first")
	}
	arp, err := openPacket(ifName, unix.ETH_P_ARP)
	if err != nil {
		return fail("%v", err)
	}
	gwMAC, _, err := resolveARP(ctx, arp, src4.AsSlice(), gw.AsSlice())
	arp.Close()
	if err != nil {
		return fail("router %v: %v", gw, err)
	}
	pc, err := openPacket(ifName, unix.ETH_P_ALL)
	if err != nil {
		return fail("%v", err)
	}
	defer pc.Close()

	p := policyProber{src: pc.mac, dst: gwMAC, port: uint16(port)}
	src6 := linkLocalOf(pc.mac) // fe80::/10: a source the policy lets through
	for _, s := range guest.LoopbackSpellings {
		d := netip.MustParseAddr(s)
		src := src4
		if d.Is6() {
			src = src6
		}
		p.all(src, d)
	}
	p.all(netip.MustParseAddr("127.0.0.1"), gw) // a loopback source, to the gateway
	res := guest.Result{Fields: map[string]string{}}
	sent := 0
	for _, f := range p.frames {
		if err := pc.send(f); err != nil {
			res.Fields["detail"] = fmt.Sprintf("send probe %d: %v", sent, err)
			break
		}
		sent++
	}
	res.Fields["sent"] = strconv.Itoa(sent)
	answers, err := p.countAnswers(pc, guest.PolicyListen)
	res.Fields["answers"] = strconv.Itoa(answers)
	if err != nil {
		res.Fields["detail"] = err.Error()
	}
	legitOK := true
	if a.params.Values[guest.ParamPolicyLegit] == "1" {
		target := netip.AddrPortFrom(gw, uint16(port)).String()
		res.Fields["legit_udp"] = okOrErr(sendUDP(target, guest.PolicyLegitPayload))
		res.Fields["legit_tcp"] = okOrErr(dialTCP(ctx, target))
		legitOK = res.Fields["legit_udp"] == "ok" && res.Fields["legit_tcp"] == "ok"
	}
	res.OK = sent == len(p.frames) && answers == 0 && legitOK && res.Fields["detail"] == ""
	return res
}

func okOrErr(err error) string {
	if err != nil {
		return err.Error()
	}
	return "ok"
}

func sendUDP(target, payload string) error {
	c, err := net.Dial("udp", target)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(payload))
	return err
}

func dialTCP(ctx context.Context, target string) error {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return err
	}
	return c.Close()
}

// linkLocalOf is the EUI-64 link-local address of mac (RFC 4291 2.5.1).
func linkLocalOf(mac net.HardwareAddr) netip.Addr {
	var b [16]byte
	b[0], b[1] = 0xfe, 0x80
	copy(b[8:11], mac[0:3])
	b[8] ^= 0x02
	b[11], b[12] = 0xff, 0xfe
	copy(b[13:16], mac[3:6])
	return netip.AddrFrom16(b)
}

// IP protocol numbers of the probes.
const (
	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
)

// policyProber builds the probe frames, each from its own source port or
// echo identifier. The frames are built here, not with the daemon's
// encoders: the agent speaks only Ethernet to the daemon.
type policyProber struct {
	src, dst net.HardwareAddr
	port     uint16
	frames   [][]byte
}

// all adds a TCP SYN, a UDP datagram and an ICMP echo request from src to d.
func (p *policyProber) all(src, d netip.Addr) {
	id := func() uint16 { return policyProbeBase + uint16(len(p.frames)) }
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:2], id())
	binary.BigEndian.PutUint16(tcp[2:4], p.port)
	binary.BigEndian.PutUint32(tcp[4:8], 1000) // sequence number
	tcp[12] = 5 << 4                           // data offset: 5 words
	tcp[13] = 0x02                             // SYN
	binary.BigEndian.PutUint16(tcp[14:16], 65535)
	p.add(src, d, protoTCP, tcp, 16)

	udp := make([]byte, 8+len(guest.PolicyProbePayload))
	binary.BigEndian.PutUint16(udp[0:2], id())
	binary.BigEndian.PutUint16(udp[2:4], p.port)
	binary.BigEndian.PutUint16(udp[4:6], uint16(len(udp)))
	copy(udp[8:], guest.PolicyProbePayload)
	p.add(src, d, protoUDP, udp, 6)

	echo := make([]byte, 8+len(guest.PolicyProbePayload))
	binary.BigEndian.PutUint16(echo[4:6], id())
	binary.BigEndian.PutUint16(echo[6:8], 1) // sequence
	copy(echo[8:], guest.PolicyProbePayload)
	if d.Is4() {
		echo[0] = 8 // echo request
		p.add(src, d, protoICMP, echo, 2)
	} else {
		echo[0] = 128
		p.add(src, d, protoICMPv6, echo, 2)
	}
}

// add fills in l4's checksum at csumOff and wraps it in IPv4 (when d is a
// plain IPv4 address) or IPv6, and Ethernet.
func (p *policyProber) add(src, d netip.Addr, proto uint8, l4 []byte, csumOff int) {
	var sum uint32
	if proto != protoICMP { // every other checksum covers the pseudo-header
		for _, a := range []netip.Addr{src, d} {
			sum = sum16(sum, a.AsSlice())
		}
		sum += uint32(proto) + uint32(len(l4))
	}
	c := ^fold(sum16(sum, l4))
	if c == 0 && proto == protoUDP {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(l4[csumOff:], c)

	var ip []byte
	et := uint16(unix.ETH_P_IP)
	if d.Is4() {
		ip = make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:4], uint16(20+len(l4)))
		ip[8], ip[9] = 64, proto
		copy(ip[12:16], src.AsSlice())
		copy(ip[16:20], d.AsSlice())
		binary.BigEndian.PutUint16(ip[10:12], ^fold(sum16(0, ip)))
	} else {
		et = unix.ETH_P_IPV6
		ip = make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:6], uint16(len(l4)))
		ip[6], ip[7] = proto, 64
		s16, d16 := src.As16(), d.As16()
		copy(ip[8:24], s16[:])
		copy(ip[24:40], d16[:])
	}
	f := make([]byte, 0, 14+len(ip)+len(l4))
	f = append(f, p.dst...)
	f = append(f, p.src...)
	f = binary.BigEndian.AppendUint16(f, et)
	f = append(f, ip...)
	p.frames = append(p.frames, append(f, l4...))
}

// sum16 adds b to sum as big-endian 16-bit words (RFC 1071).
func sum16(sum uint32, b []byte) uint32 {
	for len(b) >= 2 {
		sum += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	return sum
}

func fold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// countAnswers counts frames arriving within d that answer a probe: TCP or
// UDP to a probe's source port, or an echo reply with a probe's identifier.
func (p *policyProber) countAnswers(pc *packetConn, d time.Duration) (int, error) {
	buf := make([]byte, 65536)
	deadline := time.Now().Add(d)
	answers := 0
	for time.Now().Before(deadline) {
		tv := unix.NsecToTimeval(time.Until(deadline).Nanoseconds())
		if err := unix.SetsockoptTimeval(pc.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return answers, err
		}
		n, from, err := unix.Recvfrom(pc.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return answers, fmt.Errorf("receive: %w", err)
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue // our own probes, looped back to the socket
		}
		if p.isAnswer(buf[:n]) {
			answers++
		}
	}
	return answers, nil
}

func (p *policyProber) isAnswer(f []byte) bool {
	if len(f) < 14 {
		return false
	}
	var proto uint8
	var l4 []byte
	switch ip := f[14:]; binary.BigEndian.Uint16(f[12:14]) {
	case unix.ETH_P_IP:
		if len(ip) < 20 {
			return false
		}
		ihl := int(ip[0]&0xf) * 4
		if ihl < 20 || len(ip) < ihl {
			return false
		}
		proto, l4 = ip[9], ip[ihl:]
	case unix.ETH_P_IPV6:
		if len(ip) < 40 {
			return false
		}
		proto, l4 = ip[6], ip[40:]
	default:
		return false
	}
	if len(l4) < 8 {
		return false
	}
	ours := func(v uint16) bool { return v >= policyProbeBase && int(v) < policyProbeBase+len(p.frames) }
	switch proto {
	case protoTCP, protoUDP:
		return ours(binary.BigEndian.Uint16(l4[2:4]))
	case protoICMP:
		return l4[0] == 0 && ours(binary.BigEndian.Uint16(l4[4:6])) // echo reply
	case protoICMPv6:
		return l4[0] == 129 && ours(binary.BigEndian.Uint16(l4[4:6]))
	}
	return false
}

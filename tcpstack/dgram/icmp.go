package dgram

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
)

// ICMP echo: a guest echo request goes out of an unprivileged ping socket
// (SOCK_DGRAM, IPPROTO_ICMP/ICMPV6) connected to the destination, one per
// guest (address, identifier); the kernel picks the identifier on the wire
// and demultiplexes the replies, which we restore to the guest's identifier.
// Ping sockets need net.ipv4.ping_group_range to include our group.

const icmpEchoHdrLen = 8

// ICMP handles an ICMP or ICMPv6 message from the guest (p, parsed from
// the frame at offset skip of the iovecs frame). Only echo requests are
// translated; it returns false for everything else.
func (ft *Table) ICMP(now time.Time, p *header.Packet, frame [][]byte, skip int) bool {
	ft.now = now
	if len(p.L4) < icmpEchoHdrLen {
		return false
	}
	m := p.L4
	echo := uint8(header.ICMPv4EchoRequest)
	if p.IsIPv6() {
		echo = uint8(header.ICMPv6EchoRequest)
	}
	if m[0] != echo || m[1] != 0 {
		return false
	}
	key := packetKey(flowICMP, p, binary.BigEndian.Uint16(m[4:6]), 0)
	i, _, ok := ft.lookup(&key)
	if !ok {
		return true
	}
	// The whole message goes out as the guest built it; the kernel rewrites
	// the identifier and the checksum.
	if _, err := ft.io.Send(ft.flows[i].fd, frame, skip+p.L4Off, p.L4Len); err != nil {
		ft.st.TX.Drops[stats.DropSendError].Add(1)
	} else {
		ft.st.Proto.ICMPEchoRequests.Add(1)
	}
	return true
}

func (ft *Table) openICMP(key *flowKey, host netip.AddrPort) (int, error) {
	proto := unix.IPPROTO_ICMP
	if key.v6 {
		proto = unix.IPPROTO_ICMPV6
	}
	fd, err := ft.openDgram(host, proto)
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		return -1, errors.New("ping sockets not permitted: widen net.ipv4.ping_group_range to include our group")
	}
	return fd, err
}

// readICMP moves echo replies from flow i's ping socket into guest RX buffers.
func (ft *Table) readICMP(w guestring.Sink, i int32) flowRead {
	f := &ft.flows[i]
	hl := header.EthernetMinimumSize + header.IPv4MinimumSize
	maxPay := 65535 - header.IPv4MinimumSize
	proto := header.IPProtocolICMPv4
	if f.key.v6 {
		hl = header.EthernetMinimumSize + header.IPv6MinimumSize
		maxPay = 65535
		proto = header.IPProtocolICMPv6
	}
	for b := 0; b < flowBudget; b++ {
		if !w.Enabled() {
			return ft.discardAll(f.fd, false)
		}
		hdr, pay, s := w.Reserve(hl, maxPay)
		switch s {
		case guestring.OK:
		case guestring.NoFit, guestring.Broken:
			if _, _, err := ft.io.Recv(f.fd, ft.discardIO[:], 0); err == nil {
				ft.st.RX.Drops[stats.DropNoFit].Add(1)
				continue
			}
			return flowDrained
		default:
			return flowBlocked
		}
		n, mflags, err := ft.io.Recv(f.fd, pay, 0)
		if err != nil {
			w.Abort()
			if errors.Is(err, unix.EAGAIN) {
				return flowDrained
			}
			continue // an ICMP error queued on the socket; replies may follow
		}
		if mflags&unix.MSG_TRUNC != 0 || n < icmpEchoHdrLen {
			w.Abort()
			ft.st.RX.Drops[stats.DropNoFit].Add(1)
			continue
		}
		ft.touch(i)
		payload := pay
		var idb [2]byte
		binary.BigEndian.PutUint16(idb[:], f.key.guestPort)
		header.WriteIovecs(payload, 4, idb[:])
		header.WriteIovecs(payload, 2, []byte{0, 0})
		ft.buildL2L3(hdr, &f.key, proto, n)
		var sum uint16
		if f.key.v6 {
			sum = header.PseudoHeaderChecksum(proto, f.key.remoteAddr(), f.key.guestAddr(), uint32(n))
		}
		sum = header.ChecksumIovecs(payload, n, sum)
		var cb [2]byte
		binary.BigEndian.PutUint16(cb[:], ^sum)
		header.WriteIovecs(payload, 2, cb[:])
		ft.st.ServiceReplies[stats.SvcICMPEcho].Add(1)
		ft.st.Proto.ICMPEchoReplies.Add(1)
		w.Commit(n, nil)
	}
	return flowBudgetUsed
}

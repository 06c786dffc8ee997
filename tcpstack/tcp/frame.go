package tcp

import (
	"encoding/binary"
	"time"

	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/virtqueue"
)

// Frames to the guest: headers built in place in a reservation.

// sendFlags sends a frame without payload. It returns false when the guest
// had no RX buffer.
func (t *Table) sendFlags(f *conn, w guestring.Sink, fl header.TCPFlags, seq uint32) bool {
	var opts []byte
	o := &t.opts
	switch {
	case fl.Has(header.TCPFlagSYN):
		mss := min(t.cfg.MTU-t.ipHdrLen(f.key.v6)-header.TCPMinimumSize, 0xffff)
		*o = header.TCPOptions{HasMSS: true, MSS: uint16(mss)}
		if f.wsToGuest > 0 {
			o.HasWindowScale, o.WindowScale = true, f.wsToGuest
		}
		// SACK: offered in our SYN (a forwarded connection; the guest's
		// SYN-ACK decides), accepted in our SYN-ACK if the guest offered it.
		o.SACKPermitted = !t.cfg.NoSACK && (!fl.Has(header.TCPFlagACK) || f.guestSACK)
		opts = t.optBuf[:header.EncodeTCPOptions(t.optBuf[:], o)]
	case fl.Has(header.TCPFlagACK) && f.ooo != nil:
		*o = header.TCPOptions{}
		t.sackBlocks(f, o)
		opts = t.optBuf[:header.EncodeTCPOptions(t.optBuf[:], o)]
	}
	hdrLen := header.EthernetMinimumSize + t.ipHdrLen(f.key.v6) + header.TCPMinimumSize + len(opts)
	hdr, _, st := w.Reserve(hdrLen, 0)
	if st != guestring.OK {
		t.rxBlocked(f, true)
		return false
	}
	t.buildHeaders(f, hdr, fl, seq, opts, nil, 0)
	w.Commit(0, &t.vh)
	f.flags &^= flAckDue
	t.rxBlocked(f, false)
	return true
}

// buildHeaders writes Ethernet, IP and TCP headers for a frame to the guest
// into hdr and the virtio-net header fields for it into t.vh (a table field,
// not a local: a pointer passed to the writer interface would escape).
func (t *Table) buildHeaders(f *conn, hdr []byte, fl header.TCPFlags, seq uint32, opts []byte, payload [][]byte, n int) {
	v6 := f.key.v6
	et := header.EtherTypeIPv4
	if v6 {
		et = header.EtherTypeIPv6
	}
	off := header.EncodeEthernet(hdr, header.MAC(f.guestMAC), header.MAC(t.cfg.OurMAC), et)
	tcpLen := header.TCPMinimumSize + len(opts)
	if v6 {
		off += header.EncodeIPv6(hdr[off:], &header.IPv6Fields{
			PayloadLength: uint16(tcpLen + n),
			NextHeader:    header.IPProtocolTCP,
			HopLimit:      64,
			Source:        f.remoteAddr,
			Destination:   f.guestAddr,
		})
	} else {
		off += header.EncodeIPv4(hdr[off:], &header.IPv4Fields{
			TotalLength: uint16(header.IPv4MinimumSize + tcpLen + n),
			Flags:       header.IPv4FlagDontFragment,
			TTL:         64,
			Protocol:    header.IPProtocolTCP,
			Source:      f.remoteAddr,
			Destination: f.guestAddr,
		})
	}
	ack := uint32(0)
	if fl.Has(header.TCPFlagACK) {
		ack = f.seqAckToGuest
	}
	wnd := f.wndToGuest >> f.wsToGuest
	if fl.Has(header.TCPFlagSYN) {
		wnd = min(f.wndToGuest, 0xffff) // RFC 7323: never scaled in a SYN
	}
	th := hdr[off : off+tcpLen]
	header.EncodeTCP(th, &header.TCPFields{
		SrcPort:    f.remotePort,
		DstPort:    f.guestPort,
		SeqNum:     seq,
		AckNum:     ack,
		Flags:      fl,
		WindowSize: uint16(min(wnd, 0xffff)),
		Options:    opts,
	})
	// The window as the guest reads it: scaled windows lose the bits
	// below the scale, and the decisions that ask whether the guest can
	// send (delayed ACKs, window updates) must not count those.
	sent := min(wnd, 0xffff)
	if !fl.Has(header.TCPFlagSYN) {
		sent <<= f.wsToGuest
	}
	if fl.Has(header.TCPFlagACK) {
		f.ackSent = ack
		f.delAckAt = time.Time{} // the ACK a delayed one waited for goes with this frame
		if n > 0 && f.delAckOff {
			f.answered()
		}
		f.wndSent = sent
	}
	f.maxWndSent = max(f.maxWndSent, sent)
	psum := header.PseudoHeaderChecksum(header.IPProtocolTCP, f.remoteAddr, f.guestAddr, uint32(tcpLen+n))
	vh := &t.vh
	*vh = virtqueue.NetHdr{}
	if t.guestCsum {
		// Partial checksum: the guest (or its NIC emulation) completes it
		// from the pseudo-header sum, for free on local delivery.
		binary.BigEndian.PutUint16(th[16:18], psum)
		vh.Flags = virtqueue.NetHdrFNeedsCsum
		vh.CsumStart = uint16(off)
		vh.CsumOffset = 16
		if n > f.mssToGuest {
			vh.GSOType = virtqueue.GSOTCPv4
			if v6 {
				vh.GSOType = virtqueue.GSOTCPv6
			}
			vh.GSOSize = uint16(f.mssToGuest)
			vh.HdrLen = uint16(off + tcpLen)
		}
		return
	}
	sum := header.Checksum(th, psum)
	sum = header.ChecksumIovecs(payload, n, sum)
	binary.BigEndian.PutUint16(th[16:18], ^sum)
}

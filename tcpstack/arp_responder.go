package tcpstack

import "encoding/binary"

// arpResponder answers every ARP request with our MAC address, as passt
// does: the stack is the guest's only neighbour, whatever address it asks
// for. Probes (sender 0.0.0.0) and announcements (target = sender) are
// not answered, or the guest would see its own address as taken.
type arpResponder struct {
	ourMAC [6]byte
}

const arpFrameLen = ethHdrLen + 28

// Handle implements linkService.
func (a *arpResponder) Handle(frame, out []byte) int {
	if len(frame) < arpFrameLen || len(out) < arpFrameLen {
		return 0
	}
	arp := frame[ethHdrLen:]
	if binary.BigEndian.Uint16(arp[0:2]) != 1 || // Ethernet
		binary.BigEndian.Uint16(arp[2:4]) != etherTypeIPv4 ||
		arp[4] != 6 || arp[5] != 4 ||
		binary.BigEndian.Uint16(arp[6:8]) != 1 { // request
		return 0
	}
	senderMAC, senderIP, targetIP := arp[8:14], arp[14:18], arp[24:28]
	if binary.BigEndian.Uint32(senderIP) == 0 || string(senderIP) == string(targetIP) {
		return 0
	}
	o := out[:arpFrameLen]
	copy(o[0:6], senderMAC)
	copy(o[6:12], a.ourMAC[:])
	binary.BigEndian.PutUint16(o[12:14], etherTypeARP)
	r := o[ethHdrLen:]
	binary.BigEndian.PutUint16(r[0:2], 1)
	binary.BigEndian.PutUint16(r[2:4], etherTypeIPv4)
	r[4], r[5] = 6, 4
	binary.BigEndian.PutUint16(r[6:8], 2) // reply
	copy(r[8:14], a.ourMAC[:])
	copy(r[14:18], targetIP)
	copy(r[18:24], senderMAC)
	copy(r[24:28], senderIP)
	return arpFrameLen
}

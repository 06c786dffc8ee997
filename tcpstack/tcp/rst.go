package tcp

import (
	"vunet/tcpstack/guestring"
	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
)

// Stateless resets: a guest segment that matches no connection (a table
// that forgot it after a restart, a SYN refused because the table is full)
// is answered with an RST as RFC 9293 3.10.7.1 says, so the guest does not
// wait for its own timeouts. They queue in a small ring, served first by
// the output pass, which holds the answers to a whole TX batch (64
// frames: a guest flooding SYNs at a full table gets an RST for each while
// it keeps taking its RX buffers); when the ring is full, further ones are
// dropped, counted as pending-ring overflows (the guest's retransmission
// will ask again).

const rstQueueLen = 64

type pendingRST struct {
	flow conn // only the addressing and sequence fields are used
	fl   header.TCPFlags
	seq  uint32
}

// queueRST schedules an RST answering sg.
func (t *Table) queueRST(sg *segment) {
	if sg.flags.Has(header.TCPFlagRST) {
		return
	}
	if t.nrst == len(t.rsts) {
		t.qstats.RX.Drops[stats.DropPendingOverflow].Add(1)
		return
	}
	r := &t.rsts[t.nrst]
	t.nrst++
	f := &r.flow
	*f = conn{key: sg.key, fd: -1, guestMAC: sg.srcMAC, guestAddr: sg.src, remoteAddr: sg.dst,
		guestPort: sg.srcPort, remotePort: sg.dstPort, mssToGuest: mssDefault}
	if sg.flags.Has(header.TCPFlagACK) {
		r.fl, r.seq = header.TCPFlagRST, sg.ack
		return
	}
	n := uint32(sg.payloadLen)
	if sg.flags.Has(header.TCPFlagSYN) {
		n++
	}
	if sg.flags.Has(header.TCPFlagFIN) {
		n++
	}
	r.fl, r.seq = header.TCPFlagRST|header.TCPFlagACK, 0
	f.seqAckToGuest = sg.seq + n
}

// flushRSTs sends the queued resets; false when the guest had no buffer.
func (t *Table) flushRSTs(w guestring.Sink) bool {
	i := 0
	for ; i < t.nrst; i++ {
		r := &t.rsts[i]
		if !t.sendFlags(&r.flow, w, r.fl, r.seq) {
			break
		}
		t.stats.RSTSent.Add(1)
	}
	n := copy(t.rsts[:], t.rsts[i:t.nrst])
	t.nrst = n
	return t.nrst == 0
}

package tcpstack

import (
	"vunet/tcpstack/stats"
)

// Operator knobs of passt's: protocols turned off, a fixed source address
// for host sockets, forwarded ports bound to one interface.

// protocolDisabled reports (and counts) a guest packet of a protocol the
// configuration turns off.
func (l *loop) protocolDisabled(proto uint8) bool {
	cfg := &l.s.cfg
	var off bool
	switch proto {
	case ipProtoTCP:
		off = cfg.NoTCP
	case ipProtoUDP:
		off = cfg.NoUDP
	case ipProtoICMP, ipProtoICMPv6:
		off = cfg.NoICMP
	}
	if off {
		l.st.TX.Drops[stats.DropProtocolDisabled].Add(1)
	}
	return off
}

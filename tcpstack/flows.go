package tcpstack

import "vunet/virtqueue"

// handleIPv4Flow translates an IPv4 frame to a host socket flow. It reports
// false when the frame is not (yet) translated; the caller counts the drop.
func (l *loop) handleIPv4Flow(c *virtqueue.Chain, head []byte, frameLen, ihl int, proto uint8, fragmented bool) bool {
	return false
}

// handleIPv6Flow is handleIPv4Flow for IPv6.
func (l *loop) handleIPv6Flow(c *virtqueue.Chain, head []byte, frameLen int, next uint8) bool {
	return false
}

// onSocket handles readiness of a flow socket registered in the loop's epoll set.
func (l *loop) onSocket(fd int, events uint32) {}

// onTimer runs flow timeouts.
func (l *loop) onTimer() {}

// closeFlows closes every flow socket when the loop ends.
func (l *loop) closeFlows() {}

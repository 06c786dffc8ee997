// Package guestring puts frames into the guest's RX ring. Writer reserves
// guest buffers before anything is read for them (a frame's headers are
// built in place, its payload received straight into guest memory),
// commits frames strictly in order, publishes each loop iteration's frames
// with one used-ring update and rewinds what it popped and did not use, so
// no guest buffer is lost and no frame is counted that did not reach the
// guest. Producers see it as a Sink. Every committed frame can also go to a
// FrameCapture (pcap).
//
// It imports virtqueue and tcpstack/stats of vunet's.
package guestring

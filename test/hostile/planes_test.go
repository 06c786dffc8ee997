package hostile

import (
	"testing"

	"vunet/virtqueue"
)

// namedPlane builds a data plane for the frame-level tests; cleanup runs
// after the server has stopped.
type namedPlane struct {
	name string
	make func(t *testing.T) virtqueue.DataPlane
}

// framePlanes are the data planes garbage frames are thrown at: the ARP
// test double and vunet's real tcpstack (planes_tcpstack_test.go), so a
// hostile guest is tried against the data plane the daemon runs.
var framePlanes = []namedPlane{
	{name: "arp", make: func(t *testing.T) virtqueue.DataPlane { return newARPPlane() }},
}

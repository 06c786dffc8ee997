package hostile

import (
	"testing"

	"vunet/vhostuser"
)

// namedPlane builds a data plane for the frame-level tests; cleanup runs
// after the server has stopped.
type namedPlane struct {
	name string
	make func(t *testing.T) vhostuser.DataPlane
}

// framePlanes are the data planes garbage frames are thrown at. The ARP
// test double is always there; building with -tags hostile_tcpstack adds
// vunet's real tcpstack (kept behind a tag so these tests build while
// tcpstack is being written).
var framePlanes = []namedPlane{
	{name: "arp", make: func(t *testing.T) vhostuser.DataPlane { return newARPPlane() }},
}

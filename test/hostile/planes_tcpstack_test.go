package hostile

import (
	"testing"

	"vunet/tcpstack"
	"vunet/virtqueue"
)

func init() {
	framePlanes = append(framePlanes, namedPlane{name: "tcpstack", make: func(t *testing.T) virtqueue.DataPlane {
		s := tcpstack.New(tcpstack.Config{Logger: testLogger()})
		// Registered before the server's cleanup, so it runs after it.
		t.Cleanup(s.Close)
		return s
	}})
}

package hostile

import (
	"testing"

	"vunet/tcpstack"
	"vunet/vhostuser"
)

// stackPlane adapts tcpstack.Stack to vhostuser.DataPlane, as cmd/vunet does.
type stackPlane struct{ s *tcpstack.Stack }

func (p stackPlane) StartPair(qp vhostuser.QueuePair) error {
	return p.s.StartPair(tcpstack.QueuePair(qp))
}

func (p stackPlane) StopPair(index int) { p.s.StopPair(index) }

func init() {
	framePlanes = append(framePlanes, namedPlane{name: "tcpstack", make: func(t *testing.T) vhostuser.DataPlane {
		s := tcpstack.New(tcpstack.Config{Logger: testLogger()})
		// Registered before the server's cleanup, so it runs after it.
		t.Cleanup(s.Close)
		return stackPlane{s}
	}})
}

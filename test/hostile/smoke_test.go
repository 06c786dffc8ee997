package hostile

import "testing"

func TestHealthyBaseline(t *testing.T) {
	s := startServer(t)
	s.healthy(t)
	s.healthy(t)
}

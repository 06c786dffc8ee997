package rig

import "testing"

// Captured from dpdk-testpmd 22.11 (Debian 12) at shutdown.
const sampleStop = `
Telling cores to stop...
Waiting for lcores to finish...

  ---------------------- Forward statistics for port 0  ----------------------
  RX-packets: 1              RX-dropped: 0             RX-total: 1
  TX-packets: 6              TX-dropped: 0             TX-total: 6
  ----------------------------------------------------------------------------

  ---------------------- Forward statistics for port 1  ----------------------
  RX-packets: 6              RX-dropped: 2             RX-total: 8
  TX-packets: 1              TX-dropped: 3             TX-total: 4
  ----------------------------------------------------------------------------

  +++++++++++++++ Accumulated forward statistics for all ports+++++++++++++++
  RX-packets: 7              RX-dropped: 0             RX-total: 7
  TX-packets: 7              TX-dropped: 0             TX-total: 7
  ++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++
`

func TestParseTestpmdStats(t *testing.T) {
	got := ParseTestpmdStats(sampleStop)
	want := map[int]TestpmdPortStats{
		0: {RXPackets: 1, TXPackets: 6},
		1: {RXPackets: 6, RXDropped: 2, TXPackets: 1, TXDropped: 3},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d ports: %+v", len(got), got)
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("port %d: got %+v, want %+v", p, got[p], w)
		}
	}
	if s := ParseTestpmdStats("garbage\nForward statistics for port 9\nRX-packets: x"); s[9] != (TestpmdPortStats{}) {
		t.Errorf("damaged block parsed as %+v", s[9])
	}
}

package rig

import (
	"testing"
	"time"
)

// lossyLink is the damage of the lossy-link test, each way, per frame:
// what a netem qdisc would be asked for (loss 1%, reorder 1%,
// duplicate 0.5%), which this host's kernel does not have.
var lossyLink = Impairment{Loss: 0.01, Reorder: 0.01, Duplicate: 0.005, Seed: 7}

// lossySilence is how long a transfer over the lossy link may go without
// a byte before the test fails: TCP recovers from 1% loss in round trips,
// not seconds; only a translation that stalls (a retransmission nobody
// makes, a window that never reopens) takes this long.
const lossySilence = 10 * time.Second

// TestRigLossyLink: vunet behind a link that loses, reorders and
// duplicates frames both ways (the rig's front-end damages them; a guest
// behind testpmd, or one whose RX ring ran dry, sees real loss). TCP
// transfers both ways, at MTU 1500 and with 64 KiB GSO frames, stay
// byte-exact, and neither direction goes lossySilence without progress.
// (Before vunet kept the guest's data past a hole and SACKed it, the
// guest→host transfer at MTU 1500 stalled for good after about 7 MB: the
// guest's retransmission timeout doubled on every loss.)
func TestRigLossyLink(t *testing.T) {
	for _, mtu := range []int{1500, 65520} {
		t.Run(mtuName(mtu), func(t *testing.T) {
			r := startRig(t, Options{Impair: lossyLink, MTU: mtu})
			for _, toHost := range []bool{true, false} {
				res := transferLimits(t, rigEnds(r), toHost, 48<<20, 3*time.Minute, false, lossySilence)
				t.Logf("%.0f Mbit/s", res.gbits()*1000)
			}
			for dir, name := range []string{"guest→vunet", "vunet→guest"} {
				s := &r.Stats().Impaired[dir]
				t.Logf("%s: %d frames, %d lost, %d duplicated, %d reordered", name,
					s.Frames.Load(), s.Lost.Load(), s.Duplicated.Load(), s.Reordered.Load())
				if s.Lost.Load() == 0 || s.Duplicated.Load() == 0 || s.Reordered.Load() == 0 {
					t.Errorf("%s: the link damaged nothing of some kind", name)
				}
			}
			m := metrics(t, r)
			t.Logf("vunet: retransmissions to the guest %v (SACK recoveries %v, tail probes %v, dup ACK %v, timeout %v), RSTs sent %v",
				m.Sum("vunet_tcp_retransmissions_total"), m.Sum("vunet_tcp_retransmissions_total", `cause="sack"`),
				m.Sum("vunet_tcp_retransmissions_total", `cause="tail_probe"`), m.Sum("vunet_tcp_retransmissions_total", `cause="dup_ack"`),
				m.Sum("vunet_tcp_retransmissions_total", `cause="timeout"`), m.Sum("vunet_tcp_resets_sent_total"))
			if rst := m.Sum("vunet_tcp_resets_sent_total"); rst != 0 {
				t.Errorf("vunet sent %v RSTs", rst)
			}
			healthy(t, r)
		})
	}
}

func mtuName(mtu int) string {
	if mtu == 65520 {
		return "MTU65520"
	}
	return "MTU1500"
}

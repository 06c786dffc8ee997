package e2e

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
)

// policyPort is where the host's loopback listeners wait in the test's
// namespace, and where the guest's probes go.
const policyPort = 5999

// TestQEMUAddressPolicy is issue 8's acceptance test: a guest puts
// hand-built TCP SYNs, UDP datagrams and echo requests on the wire
// (AF_PACKET) to every loopback spelling, and from the source 127.0.0.1 to
// the gateway, with the gateway mapping on (the default) and off
// (--no-map-gw). TCP and UDP listeners on the host's 127.0.0.1, 127.9.9.9
// and ::1 accept and receive nothing of it, no answer reaches the guest,
// and every probe is counted by vunet_policy_drops_total. With the mapping
// on, the guest's ordinary traffic to the gateway still reaches the
// 127.0.0.1 listeners. One guest boot per setting.
func TestQEMUAddressPolicy(t *testing.T) {
	qemu.NeedQEMU(t)
	ns := qemu.NewNetNS(t)
	ll := &policyListeners{}
	if err := ns.Do(func() error { return ll.listen(t) }); err != nil {
		t.Fatal(err)
	}
	for _, mapGW := range []bool{true, false} {
		name := "map"
		var args []string
		if !mapGW {
			name, args = "no-map-gw", []string{"--no-map-gw"}
		}
		t.Run(name, func(t *testing.T) {
			ll.reset()
			d := qemu.StartDaemon(t, qemu.DaemonConfig{NetNS: ns, Metrics: true, Args: args})
			params := map[string]string{guest.ParamPolicyPort: strconv.Itoa(policyPort)}
			if mapGW {
				params[guest.ParamPolicyLegit] = "1"
			}
			vm := qemu.StartVM(t, qemu.VMConfig{
				Socket: d.Socket,
				Checks: []string{guest.CheckLink, guest.CheckDHCP, guest.CheckPolicy},
				Params: params,
			})
			// Not RequireResult: a failed check must not hide what the
			// host saw.
			r, err := vm.WaitResult(guest.CheckPolicy, 90*time.Second)
			if err != nil {
				t.Fatalf("guest check %s: %v", guest.CheckPolicy, err)
			}
			probes := 3 * (len(guest.LoopbackSpellings) + 1)
			if !r.OK || r.Fields["sent"] != strconv.Itoa(probes) || r.Fields["answers"] != "0" {
				t.Errorf("guest sent %s probes (want %d), saw %s answers (want 0): %s", r.Fields["sent"], probes, r.Fields["answers"], r.Format())
			} else {
				vm.Finish(t)
			}

			want := map[string]policySeen{}
			if mapGW {
				// The ordinary gateway traffic, through the mapping.
				want["127.0.0.1"] = policySeen{accepted: 1, datagrams: []string{guest.PolicyLegitPayload}}
				if err := waitUntil(5*time.Second, func() bool { return ll.seen("127.0.0.1").equal(want["127.0.0.1"]) }); err != nil {
					t.Errorf("the mapped gateway: 127.0.0.1 saw %+v, want %+v", ll.seen("127.0.0.1"), want["127.0.0.1"])
				}
			}
			time.Sleep(500 * time.Millisecond) // anything still on its way has arrived
			for _, a := range policyListenAddrs {
				if got := ll.seen(a); !got.equal(want[a]) {
					t.Errorf("host %s: accepted %d connections, received %q; want %d, %q",
						a, got.accepted, got.datagrams, want[a].accepted, want[a].datagrams)
				}
			}
			if d.Passt {
				return // passt has the same rules, but not our counters
			}
			n := float64(len(guest.LoopbackSpellings))
			m, err := d.WaitMetric(5*time.Second, "policy drops", func(m qemu.Metrics) bool {
				return m.Sum("vunet_policy_drops_total") >= 3*n+3
			})
			if err != nil {
				t.Fatalf("metrics: %v", err)
			}
			for _, proto := range []string{"tcp", "udp", "icmp"} {
				for reason, want := range map[string]float64{"dst_loopback": n, "src_loopback": 1} {
					if got := m.Sum("vunet_policy_drops_total", "protocol", proto, "reason", reason); got != want {
						t.Errorf("vunet_policy_drops_total{protocol=%q,reason=%q} = %v, want %v", proto, reason, got, want)
					}
				}
			}
			if got, want := m.Sum("vunet_policy_drops_total"), 3*n+3; got != want {
				t.Errorf("vunet_policy_drops_total = %v in all, want %v (nothing else refused)", got, want)
			}
			if got := m.Sum("vunet_queue_drops_total", "reason", "policy"); got != 3*n+3 {
				t.Errorf(`vunet_queue_drops_total{reason="policy"} = %v, want %v`, got, 3*n+3)
			}
			if len(d.Log.Match(qemu.MsgIs("guest packet refused by the address policy"))) == 0 {
				t.Errorf("no policy log line; log tail:\n%s", d.Log.Tail(20))
			}
			checkNoRingErrors(t, d)
		})
	}
}

// policyListenAddrs are the host loopback addresses listened on.
var policyListenAddrs = []string{"127.0.0.1", "127.9.9.9", "::1"}

// policySeen is what reached one listening address.
type policySeen struct {
	accepted  int
	datagrams []string
}

func (s policySeen) equal(o policySeen) bool {
	if s.accepted != o.accepted || len(s.datagrams) != len(o.datagrams) {
		return false
	}
	for i := range s.datagrams {
		if s.datagrams[i] != o.datagrams[i] {
			return false
		}
	}
	return true
}

// policyListeners are TCP and UDP listeners on policyListenAddrs at
// policyPort, recording what reaches them.
type policyListeners struct {
	mu sync.Mutex
	by map[string]policySeen // listening address → what reached it
}

func (ll *policyListeners) listen(t *testing.T) error {
	ll.reset()
	for _, a := range policyListenAddrs {
		ap := netip.AddrPortFrom(netip.MustParseAddr(a), policyPort).String()
		ln, err := net.Listen("tcp", ap)
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		pc, err := net.ListenPacket("udp", ap)
		if err != nil {
			return err
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
				ll.record(a, func(s *policySeen) { s.accepted++ })
			}
		}()
		go func() {
			buf := make([]byte, 65536)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				d := string(buf[:n])
				ll.record(a, func(s *policySeen) { s.datagrams = append(s.datagrams, d) })
			}
		}()
	}
	return nil
}

func (ll *policyListeners) record(a string, f func(*policySeen)) {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	s := ll.by[a]
	f(&s)
	ll.by[a] = s
}

func (ll *policyListeners) reset() {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	ll.by = map[string]policySeen{}
}

func (ll *policyListeners) seen(a string) policySeen {
	ll.mu.Lock()
	defer ll.mu.Unlock()
	s := ll.by[a]
	s.datagrams = append([]string(nil), s.datagrams...)
	return s
}

// waitUntil polls cond every 20 ms until it holds or d has passed.
func waitUntil(d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

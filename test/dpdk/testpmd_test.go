package dpdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"vunet/test/guest"
	"vunet/test/qemu"
	rig "vunet/test/rig/lib"
	"vunet/test/testenv"
)

// TestTestpmdExchangesFrames connects testpmd's virtio-user to vunet,
// checks the negotiation completes, injects ARP requests and probe frames on
// the TAP side and checks vunet's ARP answer comes back through the RX ring,
// with testpmd's port counters and vunet's metrics agreeing on both
// directions. It runs twice: with memory reserved up front, and with memory
// that grows after the rings are up (SET_MEM_TABLE again, rings disabled
// and re-enabled around it).
func TestTestpmdExchangesFrames(t *testing.T) {
	testenv.SkipIfShort(t)
	testenv.NeedRoot(t, "hugepages, TAP device and packet socket")
	bin := testenv.NeedTool(t, "dpdk-testpmd", "VUNET_E2E_TESTPMD", TestpmdHint)
	EnsureHugepages(t, TestpmdPages)
	for i, mem := range []int{128, 0} {
		name := "memory=dynamic"
		if mem > 0 {
			name = fmt.Sprintf("memory=%dM", mem)
		}
		t.Run(name, func(t *testing.T) {
			tap := fmt.Sprintf("vut%d%c", os.Getpid()%1000000, 'a'+i)
			exchangeFrames(t, bin, tap, mem)
		})
	}
}

func exchangeFrames(t *testing.T, bin, tap string, memMiB int) {
	start := time.Now()
	d := qemu.StartDaemon(t, qemu.DaemonConfig{Args: []string{"--one-off"}, Metrics: true})
	tp := StartTestpmd(t, bin, d.Socket, tap, memMiB)
	if _, err := tp.Out.Wait(30*time.Second, "forwarding start", qemu.RawContains("io packet forwarding")); err != nil {
		t.Fatalf("testpmd: %v", err)
	}
	if !d.Passt {
		// The pair starts once both rings have addresses, kicks and sizes:
		// the vhost-user negotiation is complete.
		for _, msg := range []string{"vhost-user features negotiated", "guest memory region", "queue pair started"} {
			if _, err := d.Log.Wait(10*time.Second, strconv.Quote(msg), qemu.MsgIs(msg)); err != nil {
				t.Fatal(err)
			}
		}
	}
	negotiated := time.Since(start)

	if err := waitInterface(tap, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := setUpNoIPv6(tap); err != nil {
		t.Fatal(err)
	}
	sock, err := openTapSocket(tap)
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()

	ourMAC := net.HardwareAddr{0x02, 'v', 'u', 'n', 'e', 't'}
	spa, tpa := net.IPv4(10, 0, 2, 15).To4(), net.IPv4(10, 0, 2, 2).To4()
	req := arpRequest(ourMAC, spa, tpa)
	// The first frames after the TAP comes up can be lost before testpmd
	// polls it: warm up until one ARP round trip works, then count.
	reply, tries, rtt, err := resolve(sock, req, tpa, 15*time.Second)
	if err != nil {
		t.Fatalf("through testpmd: %v", err)
	}
	t.Logf("ARP warm-up: reply after %d request(s), %v: %s is at %s", tries, rtt, reply.spa, reply.sha)
	var m0 qemu.Metrics
	if !d.Passt {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		m0, err = d.Scrape(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	const rounds = 5
	arpSent := tries
	for i := 0; i < rounds; i++ {
		r, n, rt, err := resolve(sock, req, tpa, 5*time.Second)
		if err != nil {
			t.Fatalf("ARP round %d: %v", i, err)
		}
		arpSent += n
		reply, rtt = r, rt
	}
	t.Logf("%d more ARP round trips, last %v", rounds, rtt)
	if !bytes.Equal(reply.ethDst, ourMAC) || !bytes.Equal(reply.tha, ourMAC) || !reply.tpa.Equal(spa) {
		t.Errorf("ARP reply addressed to eth %s / %s %s, want %s / %s %s", reply.ethDst, reply.tha, reply.tpa, ourMAC, ourMAC, spa)
	}
	if bytes.Equal(reply.sha, ourMAC) || bytes.Equal(reply.sha, make([]byte, 6)) {
		t.Errorf("ARP reply claims MAC %s, want the back-end's own", reply.sha)
	}

	const probes = 8
	for i := 0; i < probes; i++ {
		if err := sock.send(probeFrame(ourMAC, guest.ProbeEtherType, i)); err != nil {
			t.Fatalf("send probe %d: %v", i, err)
		}
	}
	if !d.Passt {
		// After the warm-up every frame reaches vunet (the TAP has IPv6 off
		// and no address, so the kernel adds none): the counters' growth
		// must match what the test sent and received.
		arp0 := m0.Sum("vunet_queue_classified_frames_total", "ethertype", "arp")
		rep0 := m0.Sum("vunet_service_replies_total", "service", "arp")
		other0 := m0.Sum("vunet_queue_classified_frames_total", "ethertype", "other")
		m, err := d.WaitMetric(5*time.Second, "injected frames counted", func(m qemu.Metrics) bool {
			return m.Sum("vunet_queue_classified_frames_total", "ethertype", "other")-other0 >= probes
		})
		if err != nil {
			t.Error(err)
		}
		if m != nil {
			other := m.Sum("vunet_queue_classified_frames_total", "ethertype", "other") - other0
			arps := m.Sum("vunet_queue_classified_frames_total", "ethertype", "arp") - arp0
			replies := m.Sum("vunet_service_replies_total", "service", "arp") - rep0
			t.Logf("vunet counted after warm-up: %v probes, %v ARP requests, %v ARP replies", other, arps, replies)
			if other != probes || arps < rounds || arps > float64(arpSent-tries) || replies != arps {
				t.Errorf("vunet counted %v probes, %v ARP requests, %v ARP replies after warm-up; want %d, %d..%d, = requests",
					other, arps, replies, probes, rounds, arpSent-tries)
			}
			if rx := m.Sum("vunet_queue_frames_total", "direction", "to_guest"); rx < float64(rounds+1) {
				t.Errorf("vunet placed %v frames in RX, want >= %d ARP replies", rx, rounds+1)
			}
			if bad := m.Sum("vunet_queue_bad_chains_total") + m.Sum("vunet_vhost_user_errors_total"); bad != 0 {
				t.Errorf("vunet counted %v bad chains or vhost-user errors with testpmd", bad)
			}
		}
	} else {
		// Let testpmd's forwarding core move them before stopping it.
		time.Sleep(1500 * time.Millisecond)
	}
	if err := tp.Stop(10 * time.Second); err != nil {
		t.Errorf("testpmd stop: %v", err)
	}
	stats := rig.ParseTestpmdStats(tp.Output())
	t.Logf("testpmd ports: virtio-user %+v, tap %+v", stats[0], stats[1])
	toVunet := uint64(rounds + 1 + probes) // frames surely delivered: warm-up loss is possible
	if s := stats[1]; s.RXPackets < toVunet {
		t.Errorf("tap port received %d frames, want >= %d injected", s.RXPackets, toVunet)
	}
	if s := stats[0]; s.TXPackets < toVunet || s.TXDropped != 0 {
		t.Errorf("virtio-user port sent %d (dropped %d) frames to vunet, want >= %d and no drops", s.TXPackets, s.TXDropped, toVunet)
	}
	if s := stats[0]; s.RXPackets < rounds+1 {
		t.Errorf("virtio-user port received %d frames from vunet, want >= %d ARP replies", s.RXPackets, rounds+1)
	}
	if s := stats[1]; s.TXPackets < rounds+1 {
		t.Errorf("tap port sent %d frames, want >= %d ARP replies", s.TXPackets, rounds+1)
	}
	t.Logf("negotiated after %v, test took %v", negotiated.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	if d.Passt {
		t.Log("passt stand-in: vunet log assertions skipped")
		return
	}
	dropped := d.Log.Match(func(l qemu.LogLine) bool {
		return l.Msg == "frame dropped" && l.Attr("ethertype") == strconv.Itoa(guest.ProbeEtherType) &&
			strings.EqualFold(l.Attr("src"), ourMAC.String())
	})
	if len(dropped) == 0 {
		t.Errorf("no %q line for ethertype %#x from %s in the daemon log", "frame dropped", guest.ProbeEtherType, ourMAC)
	}
	memTables := d.Log.Match(qemu.MsgIs("guest memory table set"))
	t.Logf("daemon saw %d SET_MEM_TABLE(s)", len(memTables))
	if memMiB == 0 && len(memTables) < 2 {
		t.Errorf("daemon saw %d SET_MEM_TABLE(s); with growing memory DPDK sends more than one, so this run did not test the re-mapping", len(memTables))
	}
	if err := d.WaitExit(10 * time.Second); err != nil {
		t.Errorf("daemon with --one-off after testpmd left: %v", err)
	}
}

func waitInterface(name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := net.InterfaceByName(name); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("TAP %s did not appear within %v", name, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// resolve sends req every 500 ms until a reply from tpa arrives or timeout
// passes; it returns the reply, the requests sent and the last round trip.
func resolve(sock *tapSocket, req []byte, tpa net.IP, timeout time.Duration) (arpReply, int, time.Duration, error) {
	buf := make([]byte, 4096)
	deadline := time.Now().Add(timeout)
	tries := 0
	for time.Now().Before(deadline) {
		sent := time.Now()
		if err := sock.send(req); err != nil {
			return arpReply{}, tries, 0, fmt.Errorf("send ARP request: %w", err)
		}
		tries++
		for wait := time.Now().Add(500 * time.Millisecond); time.Now().Before(wait); {
			n, err := sock.recvIncoming(buf, time.Until(wait))
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			if err != nil {
				return arpReply{}, tries, 0, fmt.Errorf("receive: %w", err)
			}
			if r, ok := parseARPReply(buf[:n]); ok && r.spa.Equal(tpa) {
				return r, tries, time.Since(sent), nil
			}
		}
	}
	return arpReply{}, tries, 0, fmt.Errorf("no ARP reply for %v after %d requests", tpa, tries)
}

package rig

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rxSteering records, per TCP connection of the guest (its port), which
// queue pair each data segment from the back-end came on, by sequence
// number: the back-end's order of sending, whatever order the rig's RX
// threads happened to see them in.
type rxSteering struct {
	mu   sync.Mutex
	n    int                       // frames seen, for their order
	segs map[uint16][]steeredFrame // guest port → data frames
}

type steeredFrame struct {
	seq, end uint32
	pair, n  int
}

func (s *rxSteering) observe(pair int, f []byte) {
	// Ethernet, IPv4 without options or with, TCP with payload.
	if len(f) < 14+20+20 || binary.BigEndian.Uint16(f[12:14]) != 0x0800 || f[14+9] != 6 {
		return
	}
	ip := f[14:]
	ihl := int(ip[0]&0xf) * 4
	tot := int(binary.BigEndian.Uint16(ip[2:4]))
	if len(ip) < ihl+20 {
		return
	}
	tcp := ip[ihl:]
	payload := tot - ihl - int(tcp[12]>>4)*4
	if payload <= 0 {
		return // no payload
	}
	port, seq := binary.BigEndian.Uint16(tcp[2:4]), binary.BigEndian.Uint32(tcp[4:8])
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.segs == nil {
		s.segs = map[uint16][]steeredFrame{}
	}
	s.n++
	s.segs[port] = append(s.segs[port], steeredFrame{seq: seq, end: seq + uint32(payload), pair: pair, n: s.n})
}

// switches returns, for the connection with the most data frames, how
// often the pair changed from one frame to the next in sequence order,
// and the pairs in the order they were used. A frame sent again (its
// bytes came earlier) is left out: a retransmission after the flow moved
// comes from the new pair, which is as it should be.
func (s *rxSteering) switches() (n int, path []int, segs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var fs []steeredFrame
	for _, c := range s.segs {
		if len(c) > len(fs) {
			fs = append([]steeredFrame(nil), c...)
		}
	}
	if len(fs) == 0 {
		return 0, nil, 0
	}
	base := fs[0].seq
	for _, f := range fs {
		if int32(f.seq-base) < 0 {
			base = f.seq
		}
	}
	// Sequence order from the first byte (wrap-safe), first sent first.
	slices.SortFunc(fs, func(a, b steeredFrame) int {
		if a.seq != b.seq {
			return int(int64(a.seq-base) - int64(b.seq-base))
		}
		return a.n - b.n
	})
	covered := fs[0].seq
	for _, f := range fs {
		if int32(f.seq-covered) < 0 {
			continue // these bytes came already
		}
		covered = f.end
		segs++
		if len(path) == 0 || f.pair != path[len(path)-1] {
			path = append(path, f.pair)
		}
	}
	return len(path) - 1, path, segs
}
func (s *rxSteering) reset() {
	s.mu.Lock()
	s.segs = nil
	s.mu.Unlock()
}

// TestRigMultiQueueFollowsFlows: a kernel guest with four queue pairs whose
// transmissions move to the next TX queue every 250 ms, the way Linux moves
// a socket when its thread changes vCPU (each move waits until the old
// queue's frames came back, as the socket's ooo_okay does). Long TCP
// transfers both ways, a UDP exchange and pings run across the moves:
// every byte arrives, in order (SHA-256), no transfer stalls, vunet resets
// nothing, it hands the flows from pair to pair instead, and the
// download's data comes to the guest on one RX queue at a time — in the
// order vunet sent it, the RX queue changes only when the flow moved.
func TestRigMultiQueueFollowsFlows(t *testing.T) {
	var steer rxSteering
	r := startRig(t, Options{QueuePairs: 4, TXRotate: 250 * time.Millisecond, RXObserve: steer.observe,
		HostSysctls: map[string]string{"net.ipv4.ping_group_range": "0 2147483647"}})
	ctx := context.Background()
	moves := func(proto string) float64 {
		return metrics(t, r).Sum("vunet_flow_moves_total", `protocol="`+proto+`"`, `way="in"`)
	}
	for _, toHost := range []bool{false, true} {
		name := "download"
		if toHost {
			name = "upload"
		}
		t.Run(name, func(t *testing.T) {
			steer.reset()
			m0, tx0 := moves("tcp"), r.Stats().TXMoves.Load()
			res := transfer(t, r, toHost, 768<<20, 3*time.Minute, true)
			m, txm := moves("tcp")-m0, r.Stats().TXMoves.Load()-tx0
			t.Logf("%s: %.2f Gbit/s; the guest moved its TX queue %d times, vunet moved TCP connections %v times",
				name, res.gbits(), txm, m)
			if txm < 3 || m < 2 {
				t.Errorf("TX queue moves %d, connection moves %v: the transfer did not move across queues", txm, m)
			}
			if toHost {
				return
			}
			n, path, segs := steer.switches()
			t.Logf("download: %d data segments, RX queues in sequence order: %v; vunet resent data %v times",
				segs, path, metrics(t, r).Sum("vunet_tcp_retransmissions_total"))
			if n == 0 || float64(n) > m {
				t.Errorf("the download's data changed RX queue %d times in sequence order (%v), its connection moved %v times",
					n, path, m)
			}
		})
	}
	t.Run("udp", func(t *testing.T) {
		c, err := r.HostListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		srcPorts := map[int]bool{}
		var mu sync.Mutex
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := c.ReadFrom(buf)
				if err != nil {
					return
				}
				mu.Lock()
				srcPorts[from.(*net.UDPAddr).Port] = true
				mu.Unlock()
				c.WriteTo(buf[:n], from)
			}
		}()
		port := c.LocalAddr().(*net.UDPAddr).Port
		g, err := r.GuestDial(ctx, "udp4", net.JoinHostPort(r.Gateway().String(), strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		m0 := moves("udp")
		buf := make([]byte, 2048)
		lost := 0
		const n = 600 // 3 s at 5 ms: a dozen TX moves
		for i := 0; i < n; i++ {
			msg := []byte(fmt.Sprintf("datagram %d of the flow", i))
			g.Write(msg)
			g.SetReadDeadline(time.Now().Add(time.Second))
			k, err := g.Read(buf)
			if err != nil || !bytes.Equal(buf[:k], msg) {
				lost++
			}
			time.Sleep(5 * time.Millisecond)
		}
		m := moves("udp") - m0
		mu.Lock()
		ports := len(srcPorts)
		mu.Unlock()
		t.Logf("udp: %d echoes of %d missing or wrong; the flow moved %v times; the host saw %d source ports", lost, n, m, ports)
		if lost != 0 || ports != 1 || m < 3 {
			t.Errorf("echoes missing %d, host source ports %d (want 1: one socket, moved), moves %v (want ≥ 3)", lost, ports, m)
		}
	})
	t.Run("ping", func(t *testing.T) {
		m0 := moves("icmp")
		out, err := r.GuestExec(ctx, "busybox", "ping", "-c", "300", "-i", "0.01", "-W", "1", r.Gateway().String())
		m := moves("icmp") - m0
		t.Logf("ping: the echo flow moved %v times\n%s", m, lastLines(string(out), 3))
		if err != nil || !strings.Contains(string(out), " 0% packet loss") {
			t.Errorf("ping: %v", err)
		}
		if m < 3 {
			t.Errorf("the echo flow moved %v times in 3 s of pings across queue moves", m)
		}
	})
	mt := metrics(t, r)
	if rst := mt.Sum("vunet_tcp_resets_sent_total"); rst != 0 {
		t.Errorf("vunet sent the guest %v RSTs", rst)
	}
	if d := mt.Sum("vunet_queue_drops_total", `reason="flow_moving"`); d != 0 {
		t.Errorf("%v frames dropped while their flow moved", d)
	}
	for p := 0; p < 4; p++ {
		t.Logf("pair %d: guest sent %d frames on it, received %d; vunet took over %v flows", p,
			r.Stats().TXFramesByPair[p].Load(), r.Stats().RXFramesByPair[p].Load(),
			mt.Sum("vunet_flow_moves_total", `queue="`+strconv.Itoa(p)+`"`, `way="in"`))
	}
	healthy(t, r)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(len(l)-n, 0):], "\n")
}

// TestRigMultiQueueEagerMoves: the guest's transmissions move to the next
// TX queue every 100 ms without waiting for the old queue to drain, so
// segments of one connection sit in two TX queues at once and vunet may
// see a later one first. Transfers both ways still arrive whole and in
// order, and vunet resets nothing: a segment the translation took out of
// order is the guest's to send again, as on any network.
func TestRigMultiQueueEagerMoves(t *testing.T) {
	r := startRig(t, Options{QueuePairs: 3, TXRotate: 100 * time.Millisecond, TXRotateEager: true})
	for _, toHost := range []bool{true, false} {
		transfer(t, r, toHost, 256<<20, 3*time.Minute, true)
	}
	mt := metrics(t, r)
	t.Logf("TX queue moves %d; vunet moved TCP connections %v times; frames dropped moving %v",
		r.Stats().TXMoves.Load(), mt.Sum("vunet_flow_moves_total", `protocol="tcp"`, `way="in"`),
		mt.Sum("vunet_queue_drops_total", `reason="flow_moving"`))
	if rst := mt.Sum("vunet_tcp_resets_sent_total"); rst != 0 {
		t.Errorf("vunet sent the guest %v RSTs", rst)
	}
	if mt.Sum("vunet_flow_moves_total", `protocol="tcp"`, `way="in"`) < 3 {
		t.Errorf("the connections did not move")
	}
	healthy(t, r)
}

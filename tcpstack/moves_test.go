package tcpstack

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"vunet/tcpstack/header"
	"vunet/tcpstack/stats"
	"vunet/test/testenv"
	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

// A multiqueue guest: one Stack, several queue pairs over one guest memory,
// each pair with its own rings, as QEMU with queues=N sets them up. The
// tests move one flow between TX queues the way a guest does when the
// socket's thread changes vCPU, and check what the guest and the host peer
// see: the bytes, in order, no RST, and the flow's frames to the guest on
// the RX queue of the pair it last sent on.

const (
	mqRingArea = 64 << 10
	mqDataSize = 2 << 20
)

// newMQ returns n started pairs of one Stack configured like newFlowPair.
func newMQ(t testing.TB, n int) []*testPair {
	t.Helper()
	m, err := vqtest.NewFlatMemory(uint64(2*n) * (mqRingArea + mqDataSize))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	base := newFlowPair(t, featMrg, nil) // its Stack and configuration
	pairs := make([]*testPair, n)
	ring := func(i int) *testRing {
		r, err := vqtest.NewRing(m, 256, uint64(i)*mqRingArea, uint64(2*n)*mqRingArea+uint64(i)*mqDataSize, mqDataSize, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		tr := &testRing{Ring: r, t: t}
		tr.rebuild(i, 0)
		return tr
	}
	for i := range pairs {
		p := &testPair{t: t, mem: m, s: base.s, features: featMrg, hdrLen: virtqueue.NetHdrLenFor(featMrg), announced: 1}
		p.rx, p.tx = ring(2*i), ring(2*i+1)
		p.qp = virtqueue.QueuePair{Index: i, RX: p.rx.Q, TX: p.tx.Q, RXEnabled: true, TXEnabled: true, Features: featMrg}
		for j := 0; j < 64; j++ {
			p.rx.AddBuffers(nil, 4096)
		}
		p.rx.Post()
		p.start()
		pairs[i] = p
	}
	return pairs
}

// refill posts RX buffers for every used one.
func (p *testPair) refill() {
	for p.rx.Free() > 0 {
		p.rx.AddBuffers(nil, 4096)
	}
	p.rx.Send()
}

// mqGuest is the guest's side of one TCP connection that it may send on
// any queue pair: what it receives is read from every RX ring, and the
// ring each segment came on is recorded.
type mqGuest struct {
	t            *testing.T
	pairs        []*testPair
	on           int // the pair the guest sends on now
	sport, dport uint16
	seq, ack     uint32
	got          []byte
	rxOn         []int // per data segment received: its RX ring
	rsts         int
}

func (g *mqGuest) send(flags header.TCPFlags, payload []byte) {
	g.t.Helper()
	p := g.pairs[g.on]
	p.addTX(tcpGuestFrame(testGuest4, testGw4, g.sport, g.dport, g.seq, g.ack, flags, payload))
	p.tx.Send()
	g.seq += uint32(len(payload))
	if flags&header.TCPFlagSYN != 0 {
		g.seq++
	}
}

// poll reads every RX ring once: data in order is taken and acknowledged
// on the current pair, as a guest does. It returns the segments seen.
func (g *mqGuest) poll() []header.TCP {
	g.t.Helper()
	var all []header.TCP
	for i, p := range g.pairs {
		segs, _ := p.rxTCP(g.t)
		for _, s := range segs {
			if s.DestinationPort() != g.sport {
				continue
			}
			all = append(all, s)
			if s.Flags().Has(header.TCPFlagRST) {
				g.rsts++
			}
			if n := len(s.Payload()); n > 0 {
				g.rxOn = append(g.rxOn, i)
				if s.SequenceNumber() == g.ack {
					g.got = append(g.got, s.Payload()...)
					g.ack += uint32(n)
				}
				g.send(header.TCPFlagACK, nil)
			}
		}
		p.refill()
	}
	return all
}

// until polls until cond holds on a segment.
func (g *mqGuest) until(what string, cond func(header.TCP) bool) header.TCP {
	g.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range g.poll() {
			if cond(s) {
				return s
			}
		}
		time.Sleep(200 * time.Microsecond)
	}
	g.t.Fatalf("no %s (got %d bytes so far)", what, len(g.got))
	return nil
}

// connect opens the guest's connection to a host listener through pair 0.
func mqConnect(t *testing.T, pairs []*testPair) (*mqGuest, net.Conn) {
	t.Helper()
	ln, accepted := hostListener(t)
	g := &mqGuest{t: t, pairs: pairs, sport: 41000, dport: uint16(ln.Addr().(*net.TCPAddr).Port), seq: 7000}
	g.send(header.TCPFlagSYN, nil)
	sa := g.until("SYN-ACK", func(s header.TCP) bool { return s.Flags().Has(header.TCPFlagSYN | header.TCPFlagACK) })
	g.ack = sa.SequenceNumber() + 1
	g.send(header.TCPFlagACK, nil)
	var host net.Conn
	select {
	case host = <-accepted:
	case <-time.After(3 * time.Second):
		t.Fatal("no host connection")
	}
	t.Cleanup(func() { host.Close() })
	return g, host
}

func (g *mqGuest) moveTo(pair int) { g.on = pair }

// tcpTotals sums a counter over the pairs.
func tcpTotals(pairs []*testPair, f func(*stats.TCP) uint64) uint64 {
	var n uint64
	for _, p := range pairs {
		n += f(p.s.PairTCPStats(p.qp.Index))
	}
	return n
}

// TestMovesTCPAcrossTXQueues: one connection, opened on pair 0, carries
// data both ways while the guest moves it to another TX queue eight times
// (0 → 1 → 2 → 3 → 0 → 2 → 1 → 3). After each move the host peer's data
// arrives on the new pair's RX ring only, in sequence; every byte of both
// directions arrives once, in order; nothing is reset; each move is one
// hand-over (the new pair took the connection over, none was opened).
func TestMovesTCPAcrossTXQueues(t *testing.T) {
	pairs := newMQ(t, 4)
	g, host := mqConnect(t, pairs)
	rng := rand.New(rand.NewPCG(7, 8))
	var up, down []byte
	var upGot []byte
	hostRead := func(n int) {
		t.Helper()
		b := make([]byte, n)
		host.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(host, b); err != nil {
			t.Fatalf("host read: %v", err)
		}
		upGot = append(upGot, b...)
	}
	route := []int{0, 1, 2, 3, 0, 2, 1, 3}
	for step, pair := range route {
		g.moveTo(pair)
		// The guest's data first, on the new queue: this is what moves
		// the connection.
		for i := 0; i < 3; i++ {
			chunk := make([]byte, 1000+rng.IntN(400))
			for j := range chunk {
				chunk[j] = byte(rng.Uint32())
			}
			up = append(up, chunk...)
			g.send(header.TCPFlagACK|header.TCPFlagPSH, chunk)
		}
		hostRead(len(up) - len(upGot))
		movedIn := pairs[pair].s.PairStats(pair).Flows.MovedIn[stats.FlowTCP].Load()
		if step > 0 && route[step-1] != pair && movedIn == 0 {
			t.Fatalf("step %d: pair %d never took the connection over", step, pair)
		}
		// Then the host's: it must come on the new pair's ring.
		first := len(g.rxOn)
		chunk := make([]byte, 20000+rng.IntN(20000))
		for j := range chunk {
			chunk[j] = byte(rng.Uint32())
		}
		down = append(down, chunk...)
		if _, err := host.Write(chunk); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(g.got) < len(down) && time.Now().Before(deadline) {
			g.poll()
			time.Sleep(200 * time.Microsecond)
		}
		if len(g.got) < len(down) {
			t.Fatalf("step %d: guest got %d of %d bytes", step, len(g.got), len(down))
		}
		for i, q := range g.rxOn[first:] {
			if q != pair {
				t.Fatalf("step %d: data segment %d came on RX queue %d, the guest sends on %d (rings: %v)",
					step, i, q, pair, g.rxOn[first:])
			}
		}
	}
	if !bytes.Equal(upGot, up) {
		t.Errorf("host received %d bytes, not the %d the guest sent (or not in order)", len(upGot), len(up))
	}
	if !bytes.Equal(g.got, down) {
		t.Errorf("guest received %d bytes, not the %d the host sent (or not in order)", len(g.got), len(down))
	}
	if g.rsts != 0 {
		t.Errorf("guest saw %d RSTs", g.rsts)
	}
	moves := 0
	for i := 1; i < len(route); i++ {
		if route[i] != route[i-1] {
			moves++
		}
	}
	in := dgramTotals(pairs, func(s *stats.Queue) uint64 { return s.Flows.MovedIn[stats.FlowTCP].Load() })
	out := dgramTotals(pairs, func(s *stats.Queue) uint64 { return s.Flows.MovedOut[stats.FlowTCP].Load() })
	rst := tcpTotals(pairs, func(s *stats.TCP) uint64 { return s.RSTSent.Load() })
	conns := tcpTotals(pairs, func(s *stats.TCP) uint64 { return s.Connects.Load() })
	if in != uint64(moves) || out != uint64(moves) || rst != 0 || conns != 1 {
		t.Errorf("moved in %d out %d (want %d each), RSTs sent %d, host connects %d (want 0 and 1)", in, out, moves, rst, conns)
	}
	live := int64(0)
	for _, p := range pairs {
		live += p.s.PairTCPStats(p.qp.Index).ConnsByState[stats.TCPEstablished].Load()
	}
	if live != 1 || pairs[route[len(route)-1]].s.PairTCPStats(route[len(route)-1]).ConnsByState[stats.TCPEstablished].Load() != 1 {
		t.Errorf("established connections %d in all, want 1, on pair %d", live, route[len(route)-1])
	}
}

// TestMovesTCPEverySegment: the guest sends each segment of an upload on
// the next TX queue (a flow that never stays), waiting for its ACK; every
// segment needs the connection to come from another pair. All bytes arrive
// in order, nothing is reset, nothing is dropped.
func TestMovesTCPEverySegment(t *testing.T) {
	pairs := newMQ(t, 4)
	g, host := mqConnect(t, pairs)
	var up []byte
	const segs = 120
	for i := 0; i < segs; i++ {
		g.moveTo(i % 4)
		chunk := []byte(fmt.Sprintf("segment %04d on queue %d;", i, i%4))
		up = append(up, chunk...)
		g.send(header.TCPFlagACK|header.TCPFlagPSH, chunk)
		want := g.seq
		g.until(fmt.Sprintf("ACK of segment %d", i), func(s header.TCP) bool {
			return s.Flags().Has(header.TCPFlagACK) && !seqBefore(s.AckNumber(), want)
		})
	}
	b := make([]byte, len(up))
	host.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(host, b); err != nil {
		t.Fatalf("host read: %v", err)
	}
	if !bytes.Equal(b, up) {
		t.Errorf("host received %q, want %q", b, up)
	}
	var drops, misses uint64
	for _, p := range pairs {
		st := p.stats()
		drops += st.TX.Drops[stats.DropFlowMoving].Load()
		misses += st.FlowFetchMisses.Load()
	}
	rst := tcpTotals(pairs, func(s *stats.TCP) uint64 { return s.RSTSent.Load() })
	in := dgramTotals(pairs, func(s *stats.Queue) uint64 { return s.Flows.MovedIn[stats.FlowTCP].Load() })
	if g.rsts != 0 || rst != 0 || drops != 0 || misses != 0 || in < segs-1 {
		t.Errorf("RSTs seen %d sent %d, frames dropped moving %d, fetch misses %d, moves %d (want ≥ %d)",
			g.rsts, rst, drops, misses, in, segs-1)
	}
}

func seqBefore(a, b uint32) bool { return int32(a-b) < 0 }

// TestMovesUnknownSegmentStillReset: the directory only spares flows that
// exist: a segment of no connection on any pair is answered with RST as
// before, whichever queue it came on.
func TestMovesUnknownSegmentStillReset(t *testing.T) {
	pairs := newMQ(t, 3)
	g := &mqGuest{t: t, pairs: pairs, on: 2, sport: 42000, dport: 9, seq: 5}
	g.send(header.TCPFlagACK, []byte("nobody knows me"))
	g.until("RST", func(s header.TCP) bool { return s.Flags().Has(header.TCPFlagRST) })
	if n := dgramTotals(pairs, func(s *stats.Queue) uint64 { return s.Flows.MovedIn[stats.FlowTCP].Load() }); n != 0 {
		t.Errorf("moved in %d", n)
	}
	var fetches uint64
	for _, p := range pairs {
		fetches += p.stats().FlowFetches.Load()
	}
	if fetches != 0 {
		t.Errorf("fetches %d for a flow nobody holds", fetches)
	}
}

// dgramMovedIn and dgramMovedOut count the datagram flows (UDP and ICMP
// echo) a pair took over and handed on.
func dgramMovedIn(st *stats.Queue) uint64 {
	return st.Flows.MovedIn[stats.FlowUDP].Load() + st.Flows.MovedIn[stats.FlowICMP].Load()
}

func dgramMovedOut(st *stats.Queue) uint64 {
	return st.Flows.MovedOut[stats.FlowUDP].Load() + st.Flows.MovedOut[stats.FlowICMP].Load()
}

// dgramTotals sums a queue counter over the pairs.
func dgramTotals(pairs []*testPair, f func(*stats.Queue) uint64) uint64 {
	var n uint64
	for _, p := range pairs {
		n += f(p.stats())
	}
	return n
}

// TestMovesUDPAcrossTXQueues: one guest UDP flow to a host echo server,
// each datagram sent on the next TX queue. Every echo comes back, byte for
// byte, on the RX queue of the pair that sent its request; the host sees
// one source port throughout (one host socket, moved, never reopened).
func TestMovesUDPAcrossTXQueues(t *testing.T) {
	pairs := newMQ(t, 4)
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		testenv.Unavailable(t, err, "a loopback interface with 127.0.0.1")
	}
	t.Cleanup(func() { c.Close() })
	ports := make(chan int, 256)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			ports <- from.(*net.UDPAddr).Port
			c.WriteTo(buf[:n], from)
		}
	}()
	dport := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	const n = 40
	srcPorts := map[int]bool{}
	for i := 0; i < n; i++ {
		q := (i * 3) % 4 // 0 3 2 1 0 ...
		p := pairs[q]
		payload := []byte(fmt.Sprintf("datagram %d on queue %d", i, q))
		p.addTX(udpFrame(testGuest4, testGw4, 43000, dport, payload))
		p.tx.Send()
		var got []byte
		waitFor(t, fmt.Sprintf("echo %d", i), 5*time.Second, func() bool {
			for j, o := range pairs {
				hdrs, frames := o.rxReadIP(t)
				for k, f := range frames {
					if j != q {
						t.Fatalf("echo %d came on RX queue %d, sent on %d", i, j, q)
					}
					checkUDPFrame(t, hdrs[k], f, testGw4, testGuest4, dport, 43000, payload)
					got = payload
				}
				o.refill()
			}
			return got != nil
		})
		srcPorts[<-ports] = true
	}
	if len(srcPorts) != 1 {
		t.Errorf("host saw %d source ports, want 1 (the flow's socket moved)", len(srcPorts))
	}
	opened := dgramTotals(pairs, dgramOpened)
	in := dgramTotals(pairs, dgramMovedIn)
	out := dgramTotals(pairs, dgramMovedOut)
	drops := dgramTotals(pairs, func(s *stats.Queue) uint64 { return s.TX.Drops[stats.DropFlowMoving].Load() })
	if opened != 1 || in != n-1 || out != n-1 || drops != 0 {
		t.Errorf("flows opened %d (want 1), moved in %d out %d (want %d), dropped moving %d", opened, in, out, n-1, drops)
	}
}

// TestMovesICMPAcrossTXQueues: the same for ping: one echo identifier,
// requests on rotating TX queues, each reply on its request's RX queue
// with the guest's identifier, one ping socket throughout.
func TestMovesICMPAcrossTXQueues(t *testing.T) {
	if !testenv.InPrivateNetns(t, testenv.PingAllowed) {
		return
	}
	pairs := newMQ(t, 4)
	const n = 24
	for i := 0; i < n; i++ {
		q := (i + i/4) % 4
		p := pairs[q]
		payload := []byte(fmt.Sprintf("ping %d on queue %d", i, q))
		p.addTX(icmpEchoFrame(testGuest4, testGw4, 0x4242, uint16(i), payload))
		p.tx.Send()
		var ok bool
		waitFor(t, fmt.Sprintf("echo reply %d", i), 5*time.Second, func() bool {
			for j, o := range pairs {
				_, frames := o.rxReadIP(t)
				for _, f := range frames {
					if j != q {
						t.Fatalf("reply %d came on RX queue %d, sent on %d", i, j, q)
					}
					eth, _ := header.ParseEthernet(f)
					ip, err := header.ParseIPv4(eth.Payload())
					if err != nil {
						t.Fatal(err)
					}
					m := header.ICMPv4(ip.Payload())
					if m.Type() != header.ICMPv4EchoReply || m.Ident() != 0x4242 || m.Sequence() != uint16(i) ||
						!bytes.Equal(ip.Payload()[header.ICMPMinimumSize:], payload) {
						t.Fatalf("reply %d: %x", i, []byte(ip.Payload()))
					}
					ok = true
				}
				o.refill()
			}
			return ok
		})
	}
	opened := dgramTotals(pairs, dgramOpened)
	in := dgramTotals(pairs, dgramMovedIn)
	if opened != 1 || in == 0 {
		t.Errorf("ping flows opened %d (want 1), moved in %d", opened, in)
	}
}

// TestMovesWaitForStoppedHolder: the pair holding the flow is stopped (a
// ring change in progress); the frame that needs it waits, gives up after
// fetchWait (dropped and counted, no RST), and once the holder runs again
// the guest's retransmission moves the flow.
func TestMovesWaitForStoppedHolder(t *testing.T) {
	pairs := newMQ(t, 2)
	g, host := mqConnect(t, pairs)
	pairs[0].s.StopPair(0)
	g.moveTo(1)
	seq := g.seq
	g.send(header.TCPFlagACK|header.TCPFlagPSH, []byte("first"))
	st := pairs[1].stats()
	waitFor(t, "the frame given up", 3*time.Second, func() bool { return st.TX.Drops[stats.DropFlowMoving].Load() == 1 })
	if g.rsts != 0 || tcpTotals(pairs, func(s *stats.TCP) uint64 { return s.RSTSent.Load() }) != 0 {
		t.Fatal("RST while the holder was stopped")
	}
	pairs[0].restart()
	// The guest retransmits.
	g.seq = seq
	g.send(header.TCPFlagACK|header.TCPFlagPSH, []byte("first"))
	if got := readFull(t, host, 5); got != "first" {
		t.Fatalf("host got %q", got)
	}
	if pairs[1].s.PairStats(1).Flows.MovedIn[stats.FlowTCP].Load() != 1 {
		t.Error("the connection did not move to pair 1")
	}
}

// BenchmarkUDPMove is the cost of a flow that moves with every datagram
// (the guest alternates between two TX queues), against one that stays:
// a datagram from the guest until the host socket received it.
//
// The host peer stands for a program outside the daemon: it reads with a
// blocking system call on a P of its own. Through the netpoller it waited
// for sysmon's 10 ms poll whenever both loops held their Ps
// (loop_wait.go), and net.UDPConn.ReadFrom allocates an address per call:
// both were the benchmark's cost, not the move's.
func BenchmarkUDPMove(b *testing.B) {
	for _, move := range []bool{false, true} {
		name := "stays"
		if move {
			name = "moves"
		}
		b.Run(name, func(b *testing.B) {
			pairs := newMQ(b, 2)
			old := runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 1)
			b.Cleanup(func() { runtime.GOMAXPROCS(old) })
			peer, dport := benchRemote(b) // blocking
			// A lost datagram fails the benchmark instead of hanging it.
			if err := unix.SetsockoptTimeval(peer, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5}); err != nil {
				b.Fatal(err)
			}
			frame := udpFrame(testGuest4, testGw4, 43001, dport, make([]byte, 64))
			heads := [2][]uint16{{pairs[0].newTX(frame)}, {pairs[1].newTX(frame)}}
			buf := make([]byte, 256)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				q := 0
				if move {
					q = i % 2
				}
				p := pairs[q]
				p.tx.repost(heads[q])
				p.tx.KickNow()
				if n, err := readPeer(peer, buf); err != nil || n != 64 {
					b.Fatalf("peer read: %d bytes, %v", n, err)
				}
				for { // the chain back before it is posted again
					if _, _, ok := p.tx.popUsed(); ok {
						break
					}
				}
			}
			b.StopTimer()
			if move {
				var in uint64
				for _, p := range pairs {
					in += dgramMovedIn(p.stats())
				}
				b.ReportMetric(float64(in)/float64(b.N), "moves/op")
			}
		})
	}
}

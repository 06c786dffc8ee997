package tcpstack

import (
	"net/netip"
	"testing"
	"time"

	"vunet/tcpstack/stats"
	"vunet/test/testenv"
	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

// The guest side of the tests' rings is vqtest's driver, over memfd memory
// that the device side maps as vhostuser would with the front-end's fd.

// Test guest memory: the rings at the bottom, then each ring's data
// buffers, then a scratch area for chains a test lays out by hand.
const (
	testMemSize     = 16 << 20
	testRingArea    = 1 << 20 // ring i at i*testRingArea/4
	testDataSize    = 6 << 20 // per ring
	testScratchBase = testRingArea + 2*testDataSize
)

// testRing is a vqtest.Ring plus how the test wants its device queue
// built.
type testRing struct {
	*vqtest.Ring
	t      testing.TB
	noKick bool // the front-end said "no fd": the device polls
	errFD  int  // vring error eventfd given to the queue; 0: none
}

func newTestRing(t testing.TB, g *vqtest.GuestMemory, index int, size uint16, eventIdx bool) *testRing {
	t.Helper()
	r, err := vqtest.NewRing(g, size, uint64(index)*testRingArea/4, testRingArea+uint64(index)*testDataSize, testDataSize, eventIdx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	tr := &testRing{Ring: r, t: t}
	tr.rebuild(index, 0)
	return tr
}

// rebuild makes a fresh device-side queue continuing at lastAvail, as the
// control plane does on every pair restart.
func (r *testRing) rebuild(index int, lastAvail uint16) {
	c := r.QueueConfig(index, lastAvail)
	if r.noKick {
		c.Kick = -1
	}
	c.Err, c.Logger = r.errFD, testenv.Logger()
	if err := r.Rebuild(c); err != nil {
		r.t.Fatal(err)
	}
}

// popUsed returns the next used element's head and length, if any.
func (r *testRing) popUsed() (head uint16, n uint32, ok bool) {
	u, ok := r.PopUsed()
	return uint16(u.ID), u.Len, ok
}

// repost makes the given chains available again (a driver recycling the same
// buffers) with one avail.idx store, without allocating.
func (r *testRing) repost(heads []uint16) {
	for _, h := range heads {
		r.PutAvail(h)
	}
	r.Post()
}

// testPair is a started (or startable) queue pair with its driver rings.
type testPair struct {
	t         testing.TB
	mem       *vqtest.GuestMemory
	rx, tx    *testRing
	s         *Stack
	qp        virtqueue.QueuePair
	features  uint64
	hdrLen    int
	announced int // frames the loop sends by itself at each start
}

func newTestPair(t testing.TB, features uint64, size uint16) *testPair {
	t.Helper()
	m, err := vqtest.NewFlatMemory(testMemSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	eventIdx := virtqueue.HasFeature(features, virtqueue.FeatureRingEventIdx)
	p := &testPair{t: t, mem: m, features: features, hdrLen: virtqueue.NetHdrLenFor(features)}
	p.rx = newTestRing(t, m, 0, size, eventIdx)
	p.tx = newTestRing(t, m, 1, size, eventIdx)
	cfg := Config{Logger: testenv.Logger()}
	cfg.Addr.IPv4.Addr = netip.AddrFrom4(testGuestIP)
	cfg.Addr.IPv4.PrefixLen = 24
	p.s = New(cfg)
	p.qp = virtqueue.QueuePair{Index: 0, RX: p.rx.Q, TX: p.tx.Q, RXEnabled: true, TXEnabled: true, Features: features}
	t.Cleanup(p.s.Close)
	return p
}

func (p *testPair) start() {
	p.t.Helper()
	p.qp.RX, p.qp.TX = p.rx.Q, p.tx.Q
	if err := p.s.StartPair(p.qp); err != nil {
		p.t.Fatal(err)
	}
}

// restart stops the pair and starts it on fresh queues continuing where the
// old ones stopped, as the control plane does.
func (p *testPair) restart() {
	p.s.StopPair(p.qp.Index)
	p.rx.rebuild(0, p.rx.Q.LastAvail())
	p.tx.rebuild(1, p.tx.Q.LastAvail())
	p.start()
}

// postRX gives the device n receive buffers of size bytes each, as a
// guest driver fills its RX ring, and publishes them.
func (p *testPair) postRX(n int, size uint32) {
	for i := 0; i < n; i++ {
		p.rx.AddBuffers(nil, size)
	}
	p.rx.Post()
}

// addTX queues one TX frame with a zero virtio-net header, in one
// descriptor like Linux does, without publishing.
func (p *testPair) addTX(frame []byte) uint16 {
	h := p.newTX(frame)
	p.tx.PutAvail(h)
	return h
}

// newTX is addTX without placing the chain in the avail ring.
func (p *testPair) newTX(frame []byte) uint16 {
	b := make([]byte, p.hdrLen+len(frame))
	copy(b[p.hdrLen:], frame)
	return p.tx.NewBuffers([][]byte{b})
}

func (p *testPair) stats() *stats.Queue { return p.s.PairStats(p.qp.Index) }

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

package virtqueue_test

import (
	"encoding/binary"
	"log/slog"
	"testing"

	"golang.org/x/sys/unix"

	"vunet/virtqueue"
	"vunet/virtqueue/vqtest"
)

const (
	rigMem   = 1 << 20
	rigRing  = 0x1000
	rigData  = 0x10000
	rigDataN = rigMem - rigData
)

var quiet = slog.New(slog.DiscardHandler)

type rig struct {
	g     *vqtest.GuestMemory
	d     *vqtest.Driver
	q     *virtqueue.SplitQueue
	stats *virtqueue.Stats
	cfg   virtqueue.Config
}

type rigOpt struct {
	size          uint16
	eventIdx      bool
	indirect      bool
	kick, call    bool // create eventfds
	lastAvail     uint16
	usedIdxBefore uint16
}

func newRig(t testing.TB, o rigOpt) *rig {
	t.Helper()
	if o.size == 0 {
		o.size = 8
	}
	g, err := vqtest.NewFlatMemory(rigMem)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	d := vqtest.NewDriver(g, o.size, rigRing, rigData, rigDataN)
	if o.usedIdxBefore != 0 {
		d.SetUsedIdx(o.usedIdxBefore)
	}
	r := &rig{g: g, d: d, stats: new(virtqueue.Stats)}
	r.cfg = d.Config(o.eventIdx, o.indirect)
	r.cfg.Stats = r.stats
	r.cfg.Logger = quiet
	r.cfg.LastAvail = o.lastAvail
	if o.kick {
		r.cfg.Kick = newEventfd(t)
	}
	if o.call {
		r.cfg.Call = newEventfd(t)
	}
	r.q, err = virtqueue.NewSplitQueue(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newEventfd(t testing.TB) int {
	t.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// readEventfd returns the counter, 0 when it was not signalled.
func readEventfd(t testing.TB, fd int) uint64 {
	t.Helper()
	var b [8]byte
	n, err := unix.Read(fd, b[:])
	if err == unix.EAGAIN {
		return 0
	}
	if err != nil || n != 8 {
		t.Fatalf("read eventfd: %d, %v", n, err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

func writeEventfd(t testing.TB, fd int, v uint64) {
	t.Helper()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	if _, err := unix.Write(fd, b[:]); err != nil {
		t.Fatal(err)
	}
}

// fill writes a recognizable pattern into the driver's view of a buffer.
func (r *rig) fill(gpa uint64, n int, seed byte) {
	b := r.g.Bytes(gpa, uint64(n))
	for i := range b {
		b[i] = seed + byte(i)
	}
}

func (r *rig) pop(t testing.TB, c *virtqueue.Chain) bool {
	t.Helper()
	ok, err := r.q.Pop(c)
	if err != nil {
		t.Fatalf("Pop: %v", err)
	}
	return ok
}

func flat(bufs [][]byte) []byte {
	var out []byte
	for _, b := range bufs {
		out = append(out, b...)
	}
	return out
}

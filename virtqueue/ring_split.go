package virtqueue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrBroken is returned by Pop, forever, once the driver has put the queue
// into a state that cannot be recovered (avail.idx more than the ring size
// ahead of us, or a head index outside the ring). The device should be reset
// by the front-end; until then the queue stays inert.
var ErrBroken = errors.New("virtqueue: queue broken by the driver")

// Addresses are the ring addresses of SET_VRING_ADDR, as front-end virtual
// addresses.
type Addresses struct{ Desc, Avail, Used uint64 }

// MaxQueueSize is the largest split ring virtio allows.
const MaxQueueSize = 32768

// Config describes a split virtqueue to build.
type Config struct {
	Index     int       // vring index, for logs
	Size      uint16    // power of two, 1..32768
	Addr      Addresses // front-end virtual addresses of the three parts
	LastAvail uint16    // SET_VRING_BASE value: next avail index to process
	EventIdx  bool      // VIRTIO_RING_F_EVENT_IDX negotiated
	Indirect  bool      // VIRTIO_RING_F_INDIRECT_DESC negotiated
	Kick      int       // eventfd the driver kicks; -1 = none (polling)
	Call      int       // eventfd we signal; -1 = none
	// Err is the vring's error eventfd (SET_VRING_ERR), written once when
	// the queue breaks so the front-end reports it. Values <= 0 mean none:
	// 0 is what a Config that does not set it holds, and stdin is never an
	// eventfd we were handed.
	Err    int
	Mem    *Memory
	Stats  *Stats // counters owned by the caller; may be nil
	Logger *slog.Logger

	// Log turns dirty-page logging on (live migration); nil: off.
	Log *LogConfig
}

// Ring part sizes (virtio 1.x 2.7): the trailing event fields are included.

// DescTableSize returns the size in bytes of a descriptor table of n entries.
func DescTableSize(n uint16) uint64 { return 16 * uint64(n) }

// AvailRingSize returns the size in bytes of an avail ring of n entries,
// used_event included.
func AvailRingSize(n uint16) uint64 { return 6 + 2*uint64(n) }

// UsedRingSize returns the size in bytes of a used ring of n entries,
// avail_event included.
func UsedRingSize(n uint16) uint64 { return 6 + 8*uint64(n) }

// SplitQueue is the device side of a split virtqueue. It is used by one
// goroutine (the queue pair's event loop); only its Stats are safe to read
// concurrently. Its Memory must stay mapped until the queue is dropped.
type SplitQueue struct {
	index    int
	size     uint16
	mask     uint16
	eventIdx bool
	indirect bool
	kick     int
	call     int
	errFD    int // -1: none
	mem      *Memory
	stats    *Stats
	log      *slog.Logger
	dirty    *ringLog // dirty-page logging; nil: off (ring_log.go)

	desc       []byte // descriptor table, 16*size bytes
	availRing  []byte // avail ring entries, 2*size bytes
	usedRing   []byte // used ring elements, 8*size bytes
	availFlags *uint16
	availIdx   *uint16
	usedEvent  *uint16 // in the avail ring; nil without EVENT_IDX
	usedFlags  *uint16
	usedIdx    *uint16
	availEvent *uint16 // in the used ring; nil without EVENT_IDX

	lastAvail   uint16 // next avail entry to take
	availShadow uint16 // last avail.idx read; entries up to it were checked against size
	usedNext    uint16 // next used slot to stage
	usedPub     uint16 // value of used.idx we last stored
	highAvail   uint16 // one past the furthest avail entry ever taken; > lastAvail after Unpop
	window      uint16 // entries behind highAvail whose skip marks are valid (<= size)
	skip        []bool // per avail slot: taken as a bad chain (already used), skip on re-Pop
	kicksOn     bool
	broken      bool
	// deferSig: Flush leaves the interrupt it decides on to SignalPending
	// (signal_batch.go); sigPending: one is waiting there.
	deferSig, sigPending bool

	lastBadLog time.Time
	suppressed uint64 // bad-chain log lines not written since lastBadLog
	lastSigLog time.Time

	efd eventfdIO // kick/call/err I/O state, kept here so it does not escape per call
}

// NewSplitQueue builds the device side of a split virtqueue over cfg.Mem:
// it checks the size, translates the ring addresses and checks that each
// part lies wholly inside one region and is aligned (desc 16, avail 2,
// used 4), reads the current used index from the ring, puts the kick fd in
// non-blocking mode, and enables kicks (clearing a NO_NOTIFY a previous
// back-end may have left behind). The kick and call fds are switched to
// non-blocking mode.
func NewSplitQueue(cfg Config) (*SplitQueue, error) {
	if cfg.Size == 0 || cfg.Size&(cfg.Size-1) != 0 {
		return nil, fmt.Errorf("vring %d: size %d is not a power of two", cfg.Index, cfg.Size)
	}
	if cfg.Mem == nil {
		return nil, fmt.Errorf("vring %d: no memory table", cfg.Index)
	}
	if !hostLittleEndian() || !atomic16Supported {
		return nil, fmt.Errorf("vring %d: only little-endian amd64 and arm64 hosts are supported", cfg.Index)
	}
	q := &SplitQueue{
		index:     cfg.Index,
		size:      cfg.Size,
		mask:      cfg.Size - 1,
		eventIdx:  cfg.EventIdx,
		indirect:  cfg.Indirect,
		kick:      cfg.Kick,
		call:      cfg.Call,
		errFD:     -1,
		mem:       cfg.Mem,
		stats:     cfg.Stats,
		log:       cfg.Logger,
		lastAvail: cfg.LastAvail,
		highAvail: cfg.LastAvail,
		skip:      make([]bool, cfg.Size),
	}
	if cfg.Err > 0 {
		q.errFD = cfg.Err
	}
	if q.stats == nil {
		q.stats = new(Stats)
	}
	if q.log == nil {
		q.log = slog.Default()
	}
	q.dirty = newRingLog(cfg.Log, cfg.Size, cfg.EventIdx, q.stats)
	n := uint64(cfg.Size)
	// The trailing event fields exist only with EVENT_IDX; do not demand
	// memory for them otherwise.
	ev := uint64(0)
	if cfg.EventIdx {
		ev = 2
	}
	var err error
	if q.desc, err = ringPart(cfg, "descriptor table", cfg.Addr.Desc, 16*n, 16); err != nil {
		return nil, err
	}
	avail, err := ringPart(cfg, "avail ring", cfg.Addr.Avail, 4+2*n+ev, 2)
	if err != nil {
		return nil, err
	}
	used, err := ringPart(cfg, "used ring", cfg.Addr.Used, 4+8*n+ev, 4)
	if err != nil {
		return nil, err
	}
	q.availFlags = u16At(avail, 0)
	q.availIdx = u16At(avail, 2)
	q.availRing = avail[4 : 4+2*n]
	q.usedFlags = u16At(used, 0)
	q.usedIdx = u16At(used, 2)
	q.usedRing = used[4 : 4+8*n]
	if cfg.EventIdx {
		q.usedEvent = u16At(avail, int(4+2*n))
		q.availEvent = u16At(used, int(4+8*n))
	}
	q.usedPub = load16(q.usedIdx)
	q.usedNext = q.usedPub
	q.availShadow = q.lastAvail
	if q.usedPub != q.lastAvail {
		// Chains a previous back-end took and never returned (reconnect
		// without in-flight tracking): the front-end owns that decision.
		q.log.Debug("vring resumes with chains outstanding",
			"vring", q.index, "last_avail", q.lastAvail, "used_idx", q.usedPub)
	}
	// The flag is on the shared open file description, which the
	// front-end can clear again: I/O on these fds does not rely on it
	// (eventfd_io.go), but the fallbacks there are safer with it.
	for _, fd := range []struct {
		name string
		fd   int
	}{{"kick", q.kick}, {"call", q.call}, {"err", q.errFD}} {
		if fd.fd < 0 {
			continue
		}
		if err := unix.SetNonblock(fd.fd, true); err != nil {
			return nil, fmt.Errorf("vring %d: %s fd %d non-blocking: %w", cfg.Index, fd.name, fd.fd, err)
		}
	}
	setupAIO(q.log)
	if cfg.EventIdx {
		// The driver ignores used.flags with EVENT_IDX; clear a NO_NOTIFY
		// left by a back-end that ran without it anyway.
		store16(q.usedFlags, 0)
	}
	q.EnableKicks()
	return q, nil
}

func ringPart(cfg Config, what string, uva, n, align uint64) ([]byte, error) {
	if uva%align != 0 {
		return nil, fmt.Errorf("vring %d: %s address %#x not %d-aligned", cfg.Index, what, uva, align)
	}
	b, err := cfg.Mem.UserSlice(uva, n)
	if err != nil {
		return nil, fmt.Errorf("vring %d: %s: %w", cfg.Index, what, err)
	}
	// The front-end address being aligned says nothing about where the
	// region landed in our address space (unaligned mmap offsets); atomics
	// need the host address aligned.
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%uintptr(align) != 0 {
		return nil, fmt.Errorf("vring %d: %s not %d-aligned in the mapping", cfg.Index, what, align)
	}
	return b, nil
}

// u16At returns a pointer to the uint16 at b[off] for load16/store16. The
// ring's index, flags and event fields are shared with the guest, which
// reads and writes them concurrently from another CPU; atomic loads and
// stores give the acquire/release ordering virtio needs (descriptor reads
// after avail.idx, used element writes before used.idx) and the
// store-then-load full barrier of the notification protocol. Safety: b[off:off+2] is inside the ring slice
// (bounds-checked below), its host address is 2-aligned (checked by
// ringPart), and the mapping outlives the queue (caller's contract). The
// fields are little-endian in memory; NewSplitQueue refuses big-endian
// hosts, so a native load is the right value.
func u16At(b []byte, off int) *uint16 {
	_ = b[off+1]
	return (*uint16)(unsafe.Pointer(&b[off]))
}

func hostLittleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// Size returns the ring size.
func (q *SplitQueue) Size() uint16 { return q.size }

// LastAvail returns the next avail index to process (GET_VRING_BASE, and
// LastAvail of the queue that replaces this one). Chains popped but not yet
// pushed are counted as processed: Unpop them first, and after an Unpop
// re-Pop them or accept that the value counts them as unprocessed.
func (q *SplitQueue) LastAvail() uint16 { return q.lastAvail }

// UsedIndex returns the used index the queue last published (read from the
// ring when the queue was built): what the driver sees in used.idx.
func (q *SplitQueue) UsedIndex() uint16 { return q.usedPub }

// KickFD returns the kick eventfd, -1 if none.
func (q *SplitQueue) KickFD() int { return q.kick }

// Pop takes the next available chain into c, overwriting what c held.
// ok=false when the ring is empty. Bad chains (loop, out-of-memory address, length overflow, nested
// indirect, bad indirect table, more descriptors than the ring, readable
// after writable, too many segments) are not returned: they are staged as
// used with length 0 (published by the next Flush), counted in
// Stats.BadChains, logged at most once a second per queue, and Pop goes on
// with the next chain. avail.idx more than Size ahead of LastAvail, or a
// head index outside the ring, breaks the queue: ErrBroken from then on.
//
// With EVENT_IDX and kicks enabled, finding the ring empty also moves
// avail_event to LastAvail (with the re-check EnableKicks does), so a loop
// that pops until empty and then waits for a kick never misses one.
func (q *SplitQueue) Pop(c *Chain) (ok bool, err error) {
	ok, _, err = q.PopSkipping(c)
	return ok, err
}

// PopSkipping is Pop that also counts the used entries it went past: bad
// chains it returned as used, and ones returned before and given back by
// Unpop. A caller holding chains popped earlier must not Unpop them once
// it is not zero: the rewind would cross entries the guest already has
// back, and a queue rebuilt from LastAvail (GET_VRING_BASE) would use
// them again. Such chains go back to the guest with Push instead.
func (q *SplitQueue) PopSkipping(c *Chain) (ok bool, skipped int, err error) {
	c.reset()
	for {
		if q.broken {
			return false, skipped, ErrBroken
		}
		if q.lastAvail == q.availShadow && !q.refreshAvail() {
			return false, skipped, q.errIfBroken()
		}
		slot := uint32(q.lastAvail & q.mask)
		// An entry taken before and given back by Unpop: if it was a bad
		// chain it is already used and must not be pushed twice.
		again := q.lastAvail != q.highAvail
		if again && q.skip[slot] {
			q.lastAvail++
			skipped++
			continue
		}
		head := binary.LittleEndian.Uint16(q.availRing[2*slot:])
		if head >= q.size {
			q.breakQueue("head index out of range", "head", head, "avail", q.lastAvail)
			return false, skipped, ErrBroken
		}
		q.lastAvail++
		if !again {
			q.highAvail = q.lastAvail
			if q.window < q.size {
				q.window++
			}
		}
		// Re-taken entries are walked again: the guest may have changed
		// the descriptors, and nothing is trusted from the first walk.
		w := walker{mem: q.mem, c: c}
		if r := w.walk(q.desc, head, uint32(q.size), q.indirect); r != badNone {
			q.skip[slot] = true
			q.badChain(head, &w, r)
			c.reset()
			skipped++
			continue
		}
		q.skip[slot] = false
		c.Head = head
		c.Readable = c.segs[:w.nread:w.nread]
		if !again {
			q.stats.Chains.Add(1)
		}
		return true, skipped, nil
	}
}

func (q *SplitQueue) errIfBroken() error {
	if q.broken {
		return ErrBroken
	}
	return nil
}

// refreshAvail loads avail.idx and reports whether entries are pending.
func (q *SplitQueue) refreshAvail() bool {
	// Acquire: the ring entries and descriptors behind idx are read after.
	idx := load16(q.availIdx)
	if idx == q.lastAvail && q.eventIdx && q.kicksOn {
		store16(q.availEvent, q.lastAvail)
		if q.dirty != nil {
			q.logUsedRing()
		}
		// Sequentially consistent store then load: a driver that added
		// entries before seeing the new avail_event is seen here.
		idx = load16(q.availIdx)
	}
	if pending := idx - q.lastAvail; pending > q.size {
		q.breakQueue("avail index ran ahead", "avail_idx", idx, "last_avail", q.lastAvail)
		return false
	}
	q.availShadow = idx
	return idx != q.lastAvail
}

func (q *SplitQueue) breakQueue(msg string, args ...any) {
	if q.broken {
		return
	}
	q.broken = true
	q.log.Error("virtqueue broken: "+msg, append([]any{"vring", q.index, "size", q.size}, args...)...)
	if err := q.SignalErr(); err != nil {
		q.log.Warn("virtqueue: signal error fd", "vring", q.index, "err", err)
	}
}

func (q *SplitQueue) badChain(head uint16, w *walker, r badReason) {
	q.stats.BadChains.Add(1)
	q.Push(head, 0)
	now := time.Now()
	if !q.lastBadLog.IsZero() && now.Sub(q.lastBadLog) < time.Second {
		q.suppressed++
		return
	}
	q.log.Warn("bad descriptor chain returned unused",
		"vring", q.index, "head", head, "reason", r.String(),
		"desc", w.badIndex, "addr", w.badAddr, "len", w.badLen,
		"suppressed", q.suppressed)
	q.lastBadLog = now
	q.suppressed = 0
}

// Unpop gives back the last n chains Pop returned, which must not have been
// pushed (RX reservations left unused): the next Pops return them again, in
// the same order. Bad chains Pop consumed in between stay used and are
// skipped on the way back and forth. n <= 0 does nothing; n is clamped to
// the chains this queue popped within the last Size avail entries (a
// misuse, logged): Unpop never panics.
//
// The skip marks live in this queue only: a queue rebuilt from LastAvail
// after an Unpop across a bad chain walks that chain again and returns it
// as used a second time. Only a guest that posts malformed chains can get
// there, and only its own device suffers; the data plane never hands a
// queue back in that state: it pops with PopSkipping, and the chains it
// popped before a skipped entry are pushed empty, not unpopped.
func (q *SplitQueue) Unpop(n int) {
	if n <= 0 {
		return
	}
	done := 0
	for done < n && q.highAvail-q.lastAvail < q.window {
		q.lastAvail--
		if !q.skip[q.lastAvail&q.mask] {
			done++
		}
	}
	if done < n {
		q.log.Warn("virtqueue: Unpop beyond popped chains, clamped",
			"vring", q.index, "asked", n, "rewound", done)
	}
}

// Push stages one used element: chain head, written bytes. The guest does
// not see it before Flush. A head outside the ring (a caller bug) is
// ignored; if Size elements are already staged, they are flushed first so
// that staging never overwrites an unpublished element.
func (q *SplitQueue) Push(head uint16, written uint32) {
	if head >= q.size {
		q.log.Error("virtqueue: Push of head outside the ring ignored", "vring", q.index, "head", head)
		return
	}
	if q.usedNext-q.usedPub == q.size {
		q.Flush()
	}
	e := q.usedRing[8*uint32(q.usedNext&q.mask):]
	binary.LittleEndian.PutUint32(e[0:], uint32(head))
	binary.LittleEndian.PutUint32(e[4:], written)
	q.usedNext++
	if q.dirty != nil {
		q.logWritten(head, written)
	}
}

// Staged returns the number of used elements pushed but not yet flushed.
func (q *SplitQueue) Staged() int { return int(q.usedNext - q.usedPub) }

// Flush publishes the staged used elements with one used.idx store, then
// signals the call eventfd once if the driver wants it: with EVENT_IDX when
// the new used index passed used_event, otherwise unless the driver set
// NO_INTERRUPT. It does nothing when nothing is staged.
func (q *SplitQueue) Flush() {
	old, next := q.usedPub, q.usedNext
	if old == next {
		return
	}
	// Release: the elements written by Push become visible with the index.
	store16(q.usedIdx, next)
	q.usedPub = next
	if q.dirty != nil {
		q.logUsedRing()
	}
	q.stats.UsedPublished.Add(uint64(next - old))
	if !q.needSignal(old, next) {
		q.stats.NotifiesSuppressed.Add(1)
		return
	}
	q.stats.Notifies.Add(1)
	if q.deferSig {
		q.sigPending = true
		return
	}
	q.signalFailed(q.Signal())
}

// signalFailed counts and logs a failed interrupt; err nil does nothing.
func (q *SplitQueue) signalFailed(err error) {
	if err == nil {
		return
	}
	q.stats.SignalErrors.Add(1)
	// A lost interrupt can stall the guest: say so, once a second.
	if now := time.Now(); now.Sub(q.lastSigLog) >= time.Second {
		q.lastSigLog = now
		q.log.Error("virtqueue: signal failed", "vring", q.index, "err", err,
			"errors", q.stats.SignalErrors.Load())
	}
}

// needSignal decides whether publishing used entries old..next needs an
// interrupt. The loads follow the used.idx store (sequentially consistent),
// so a driver that re-enabled interrupts concurrently is seen.
func (q *SplitQueue) needSignal(old, next uint16) bool {
	if q.eventIdx {
		return NeedEvent(load16(q.usedEvent), next, old)
	}
	return load16(q.availFlags)&AvailFlagNoInterrupt == 0
}

// NeedEvent is the virtio event-index test (vring_need_event): moving an
// index from old to next crosses event, i.e. event is in [old, next) modulo
// 2^16.
func NeedEvent(event, next, old uint16) bool {
	return next-event-1 < next-old
}

// DisableKicks asks the driver not to kick: without EVENT_IDX it sets
// VRING_USED_F_NO_NOTIFY; with EVENT_IDX it stops moving avail_event, so the
// driver kicks at most once more. Kicks are a hint; poll with Pop.
func (q *SplitQueue) DisableKicks() {
	q.kicksOn = false
	if !q.eventIdx {
		store16(q.usedFlags, UsedFlagNoNotify)
		if q.dirty != nil {
			q.logUsedRing()
		}
	}
}

// EnableKicks asks for kicks again (avail_event = LastAvail with EVENT_IDX,
// NO_NOTIFY cleared otherwise), then, after a full barrier, re-reads
// avail.idx: more=true means entries arrived meanwhile and no kick may come
// for them, so keep popping.
func (q *SplitQueue) EnableKicks() (more bool) {
	q.kicksOn = true
	if q.eventIdx {
		store16(q.availEvent, q.lastAvail)
	} else {
		store16(q.usedFlags, 0)
	}
	if q.dirty != nil {
		q.logUsedRing()
	}
	// Sequentially consistent store then load: the full barrier the
	// notification protocol needs against the driver's store-then-load.
	return load16(q.availIdx) != q.lastAvail
}

// RearmKicks is EnableKicks for a consumer that goes on popping when more
// came: then kicks are disabled again. Left enabled while it pops, a driver
// without EVENT_IDX (DPDK's virtio-user) reads NO_NOTIFY clear and kicks
// for every chain it adds meanwhile, a wake-up each for nothing.
func (q *SplitQueue) RearmKicks() (more bool) {
	if !q.EnableKicks() {
		return false
	}
	q.DisableKicks()
	return true
}

// DrainKick reads the kick eventfd's counter without blocking, so that a
// level-triggered poller stops reporting it. An empty counter is not an
// error; no kick fd is not an error either. It never blocks, whatever the
// front-end did to the fd's flags (eventfd_io.go).
func (q *SplitQueue) DrainKick() error {
	if q.kick < 0 {
		return nil
	}
	n, err := q.efd.read(q.kick)
	if err != nil {
		return fmt.Errorf("vring %d: kick fd: %w", q.index, err)
	}
	q.stats.Kicks.Add(n)
	return nil
}

// CountKick counts one kick that an edge-triggered poller reported. Such a
// poller never reads the counter (a system call per wake-up saved): every
// write to an eventfd is a new edge. DrainKick still clears the counter
// when the poller stops, so that the front-end, which reads it once it
// takes the ring back, finds no kick that was ours.
func (q *SplitQueue) CountKick() { q.stats.Kicks.Add(1) }

// SignalErr adds 1 to the error eventfd (Config.Err), telling the
// front-end that this vring failed; QEMU logs it. The queue calls it itself
// when it breaks; the caller calls it for failures the queue cannot see (a
// fault on guest memory). No error fd is not an error. It never blocks.
func (q *SplitQueue) SignalErr() error {
	if q.errFD < 0 {
		return nil
	}
	q.stats.ErrSignals.Add(1)
	return q.efd.signal(q.errFD)
}

// Signal adds 1 to the call eventfd, unconditionally (Flush decides when
// it is needed; after a reconnect a spurious call unsticks a waiting
// driver). No call fd is not an error. A full counter means an interrupt is
// pending anyway. It never blocks (eventfd_io.go).
func (q *SplitQueue) Signal() error {
	if q.call < 0 {
		return nil
	}
	return q.callErr(q.efd.signal(q.call))
}

// callErr says which ring's call eventfd err is about; nil stays nil.
func (q *SplitQueue) callErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("vring %d: call fd: %w", q.index, err)
}

package vhostuser

import (
	"encoding/binary"
	"fmt"

	"vunet/virtqueue"
)

// Dirty-page logging for live migration (spec, "Migration"). QEMU migrates
// a guest on a vhost-user back-end only if the back-end offers
// VHOST_F_LOG_ALL and VHOST_USER_PROTOCOL_F_LOG_SHMFD. When a migration
// starts it sends, per device:
//
//	SET_LOG_BASE (a memfd, its size and offset; the back-end replies),
//	SET_FEATURES with LOG_ALL, SET_VRING_ADDR with VHOST_VRING_F_LOG and
//	the used ring's guest-physical log address, per ring;
//
// and the same without LOG_ALL and F_LOG when it is cancelled. A device
// that starts while a migration runs gets SET_FEATURES and the rings first
// and SET_LOG_BASE last. From then on every write into guest memory is
// marked in the log (virtqueue, ring_log.go) until the rings stop
// (GET_VRING_BASE), after which QEMU reads the log a last time.
//
// The queues are built with the log they use: any change (a new log,
// LOG_ALL on or off, a ring's F_LOG) rebuilds the running pairs, as every
// other ring change does, so the data plane needs no lock and checks one
// pointer when logging is off.

// sizeLog is the log description payload: u64 mmap size, u64 mmap offset.
const sizeLog = 16

// LogDesc is the log description of SET_LOG_BASE.
type LogDesc struct {
	Size   uint64 // bytes of the log
	Offset uint64 // where the log starts in the fd (where guest address 0 is logged)
}

// Encode appends the wire form of l to b.
func (l LogDesc) Encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, l.Size)
	return binary.LittleEndian.AppendUint64(b, l.Offset)
}

// DecodeLogDesc parses a log description (exactly 16 bytes).
func DecodeLogDesc(p []byte) (LogDesc, error) {
	if len(p) != sizeLog {
		return LogDesc{}, fmt.Errorf("log description: %d bytes: %w", len(p), ErrMalformed)
	}
	return LogDesc{Size: binary.LittleEndian.Uint64(p), Offset: binary.LittleEndian.Uint64(p[8:])}, nil
}

// setLogBase handles SET_LOG_BASE. With LOG_SHMFD the front-end waits for a
// reply whatever happens (QEMU checks only that it came): a log that cannot
// be used is answered with a non-zero u64, counted and logged, and the
// queues go on without logging; the reply is all a front-end can be told.
// Without LOG_SHMFD the log would be an address in the front-end's own
// memory, which a separate process cannot reach: refused.
func (d *device) setLogBase(m *Message) ([]byte, error) {
	if d.protocol&ProtocolLogSHMFD == 0 {
		return nil, fmt.Errorf("SET_LOG_BASE without LOG_SHMFD negotiated: %w", ErrInvalid)
	}
	desc, _ := DecodeLogDesc(m.Payload)
	l, err := virtqueue.MapDirtyLog(m.FDs[0], desc.Size, desc.Offset)
	if err != nil {
		d.stats.countError(ErrReasonInvalid)
		d.log.Error("vhost-user dirty log refused: writes to guest memory are not logged, "+
			"a migration now would corrupt the guest's network buffers", "err", err)
		return EncodeU64(d.out[:0], 1), nil
	}
	d.swapLog(l)
	d.log.Info("vhost-user dirty log set", "size", desc.Size, "offset", desc.Offset,
		"covers", fmt.Sprintf("%#x", desc.Size*8*virtqueue.DirtyLogPageSize))
	return EncodeU64(d.out[:0], 0), nil
}

// swapLog installs l (nil: none) as the device's log. Pairs that log are
// stopped first, so nothing writes to the old log when it is unmapped, and
// restarted with the new one.
func (d *device) swapLog(l *virtqueue.DirtyLog) {
	old := d.dirtyLog
	restart := d.features&FeatureLogAll != 0
	if restart {
		d.stopAll()
	}
	d.dirtyLog = l
	// Deferred: a restart can fault on guest memory and unwind to process.
	defer d.unmapLog(old)
	if restart {
		if err := d.startAll(); err != nil {
			d.stats.countError(classify(err))
			d.log.Error("queue pair not restarted after dirty log change", "err", err)
		}
	}
}

// unmapLog unmaps a log the device no longer uses, unless a pair was
// abandoned: its queues still mark the log they were given, so it stays
// mapped until that pair's stop returns (stop_deadline.go).
func (d *device) unmapLog(l *virtqueue.DirtyLog) {
	if l == nil {
		return
	}
	if d.gone != nil {
		d.gone.logs = append(d.gone.logs, l)
		return
	}
	if err := l.Unmap(); err != nil {
		d.log.Warn("unmap dirty log", "err", err)
	}
}

// logAllChanged is called by setFeatures with every pair stopped when
// LOG_ALL was switched. Off: the migration ended or was cancelled, and the
// front-end has freed its log; ours goes too (the next migration sends a
// new one), so a cancelled migration leaves no memfd mapped.
func (d *device) logAllChanged() {
	if d.features&FeatureLogAll != 0 {
		d.log.Info("vhost-user dirty logging on (migration)", "log", d.dirtyLog != nil)
		return
	}
	d.log.Info("vhost-user dirty logging off")
	d.unmapLog(d.dirtyLog)
	d.dirtyLog = nil
}

// setLogFD handles SET_LOG_FD: an optional eventfd to tell the front-end
// that the log changed. QEMU polls the log instead and never sends it;
// vunet does not signal log writes (the spec makes it optional), so the fd
// is accepted and closed.
func (d *device) setLogFD() error {
	d.log.Debug("vhost-user SET_LOG_FD: log writes are not signalled, fd closed")
	return nil
}

// ringLogConfig returns what ring r's queue logs into, nil when logging is
// off (LOG_ALL not negotiated, or no log yet: QEMU sends SET_LOG_BASE after
// the rings when a device starts during a migration, which rebuilds them).
func (d *device) ringLogConfig(i int) *virtqueue.LogConfig {
	if d.features&FeatureLogAll == 0 || d.dirtyLog == nil {
		return nil
	}
	r := &d.rings[i]
	lc := &virtqueue.LogConfig{Log: d.dirtyLog, UsedGPA: r.logAddr, LogUsed: r.addrFlags&VringFlagLog != 0}
	if lc.LogUsed {
		// The spec: the last byte of the used ring must fall inside the
		// log. Writes beyond it are counted as misses, not made.
		last := r.logAddr + virtqueue.UsedRingSize(r.num) - 1
		if last < r.logAddr || last/virtqueue.DirtyLogPageSize/8 >= d.dirtyLog.Size() {
			d.stats.countError(ErrReasonInvalid)
			d.warn("vhost-user used ring log address beyond the dirty log: its writes are not logged",
				"vring", i, "log_addr", fmt.Sprintf("%#x", r.logAddr), "log_size", d.dirtyLog.Size())
		}
	}
	return lc
}

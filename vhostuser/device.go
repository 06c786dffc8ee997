package vhostuser

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"vunet/virtqueue"
)

// MaxQueuePairs is the most queue pairs a device offers: ring indices are
// eight bits wide in the kick/call/err payloads.
const MaxQueuePairs = 128

// MaxRings is the number of vring indices (two per queue pair).
const MaxRings = 2 * MaxQueuePairs

// MaxMemSlots is the GET_MAX_MEM_SLOTS answer: how many regions
// ADD_MEM_REG may install.
const MaxMemSlots = 32

// DefaultMaxMemory is the default cap on the guest memory a session may
// map (DeviceConfig.MaxMemory): 1 TiB, far above what a guest served by a
// user-space network back-end has, far below the 128 TiB of address space
// an x86-64 process has.
const DefaultMaxMemory = 1 << 40

// Session timeouts (DeviceConfig). QEMU sends its first message as soon
// as it connects (libvirt's hot-plug adds the netdev right after the
// chardev) and writes each message whole.
const (
	DefaultFirstMessageTimeout = 10 * time.Second
	DefaultMessageTimeout      = 5 * time.Second
)

// DeviceConfig configures the device every front-end session gets.
type DeviceConfig struct {
	QueuePairs int                 // offered (GET_QUEUE_NUM, MQ); 0 means 1; at most MaxQueuePairs
	DataPlane  virtqueue.DataPlane // runs the queue pairs; required
	Logger     *slog.Logger        // nil: slog.Default()
	Stats      *Stats              // control-plane counters; may be nil
	// Features are the virtio features offered; 0 means DefaultFeatures.
	// The data plane must honour every bit offered here (offloads).
	// RING_PACKED and ACCESS_PLATFORM are never offered; VHOST_F_LOG_ALL
	// (migration, in DefaultFeatures) is the control plane's own.
	Features uint64
	// MaxMemory caps the total size of the guest memory regions mapped at
	// once (distinct regions of the memory table); 0 means
	// DefaultMaxMemory. Mappings reserve address space without committing
	// memory, so a front-end could otherwise exhaust the address space
	// with sparse files and make the next Go heap growth fatal.
	MaxMemory uint64
	// StopTimeout bounds each StopPair; 0 means DefaultStopTimeout. A pair
	// that takes longer is abandoned (stop_deadline.go).
	StopTimeout time.Duration
	// FirstMessageTimeout bounds the wait for a new connection's first
	// message (0: DefaultFirstMessageTimeout), so a connection that says
	// nothing cannot hold the one front-end slot. MessageTimeout bounds
	// the rest of a message once its first byte arrived (0:
	// DefaultMessageTimeout). Between messages a session may idle forever.
	FirstMessageTimeout, MessageTimeout time.Duration

	// stuck is shared by the sessions of one Serve/Connect/ServeConn.
	stuck *stuckPairs
}

// Device errors, matched with errors.Is. Errors from the codec wrap
// ErrMalformed, ErrTruncated or ErrFDCount.
var (
	ErrInvalid     = errors.New("invalid request")
	ErrUnsupported = errors.New("unsupported request")
	errMemory      = errors.New("memory table")
	errMemoryLimit = errors.New("guest memory limit")
	errDataPlane   = errors.New("data plane")
)

// device is the vhost-user state machine of one front-end session. It is
// driven by one goroutine; the data plane runs the rings concurrently but is
// only reconfigured through StopPair/StartPair.
type device struct {
	dp      virtqueue.DataPlane
	control int // the session's socket, for QueuePair.ControlFD; -1: none
	log     *slog.Logger
	stats   *Stats
	pairs   int
	offered uint64
	maxMem  uint64

	stopTimeout time.Duration
	stuck       *stuckPairs // pairs abandoned by this or earlier sessions
	gone        *abandoned  // what this session abandoned; nil: nothing

	features uint64 // acknowledged by SET_FEATURES
	protocol uint64 // acknowledged by SET_PROTOCOL_FEATURES
	owned    bool
	status   uint8
	mtu      int

	mem   *virtqueue.Memory
	slots []memSlot

	dirtyLog *virtqueue.DirtyLog // SET_LOG_BASE; nil: none (dirty_log.go)
	// migrationStopped: the data plane was told that every ring stopped
	// during a migration (migration.go); a pair start clears it.
	migrationStopped bool
	// transfer is the device state transfer under way (device_state.go).
	transfer chan error

	rings   []vring
	running []bool // per pair

	out []byte // reply payload buffer

	// warnLimit rate-limits the warnings a front-end provokes at will
	// (failed and ignored requests).
	warnLimit logLimiter
	// warnedVringLog: VHOST_VRING_F_LOG was seen and reported (once).
	warnedVringLog bool
}

func newDevice(cfg DeviceConfig) *device {
	pairs := cfg.QueuePairs
	if pairs <= 0 {
		pairs = 1
	}
	pairs = min(pairs, MaxQueuePairs)
	offered := cfg.Features
	if offered == 0 {
		offered = DefaultFeatures
	}
	// Bits the control plane cannot honour whatever the data plane does:
	// packed rings, IOMMU translation.
	offered &^= 1<<virtqueue.FeatureRingPacked | 1<<virtqueue.FeatureAccessPlatform
	// VIRTIO_NET_F_MQ passes through QEMU to the guest: without it a guest
	// driver uses one pair whatever `queues=N` says, so it follows the pairs
	// we serve.
	if pairs > 1 {
		offered |= 1 << virtqueue.FeatureNetMQ
	} else {
		offered &^= 1 << virtqueue.FeatureNetMQ
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = limitLogger(log) // as is when Serve or Connect limited it for all sessions
	stats := cfg.Stats
	if stats == nil {
		stats = &Stats{}
	}
	maxMem := cfg.MaxMemory
	if maxMem == 0 {
		maxMem = DefaultMaxMemory
	}
	stopTimeout := cfg.StopTimeout
	if stopTimeout <= 0 {
		stopTimeout = DefaultStopTimeout
	}
	stuck := cfg.stuck
	if stuck == nil {
		stuck = newStuckPairs()
	}
	mem, _ := virtqueue.NewMemory(nil)
	d := &device{
		stopTimeout: stopTimeout,
		stuck:       stuck,
		dp:          cfg.DataPlane,
		control:     -1,
		log:         log,
		stats:       stats,
		pairs:       pairs,
		offered:     offered,
		maxMem:      maxMem,
		mem:         mem,
		rings:       make([]vring, 2*pairs),
		running:     make([]bool, pairs),
		out:         make([]byte, 0, 64),
	}
	for i := range d.rings {
		d.rings[i].reset()
	}
	return d
}

// process handles one message. It returns the reply payload to send (send
// is false when nothing is sent back). A non-nil error means the connection
// must be closed; errors that were reported to the front-end in a reply are
// logged and counted here and not returned. Descriptors in m that process
// does not keep are closed.
func (d *device) process(m *Message) (reply []byte, send bool, err error) {
	defer m.closeFDs()
	defer func() {
		// Building a queue touches guest memory; with SetPanicOnFault on
		// (serveSession) a front-end that shrank its memory file under us
		// faults here. That closes the connection, not the daemon.
		if r := recover(); r != nil {
			fault, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r)
			}
			d.stats.countError(ErrReasonMemory)
			reply, send = nil, false
			err = fmt.Errorf("%v: guest memory fault at %#x: %w", m.Header.Request, fault.Addr(), errMemory)
		}
	}()
	h := m.Header
	d.stats.countMessage(h.Request)
	d.log.Debug("vhost-user request", "request", h.Request, "flags", h.Flags, "size", h.Size, "fds", len(m.FDs))

	needReply := h.Flags&FlagNeedReply != 0
	// RESET_DEVICE forgets the protocol features: the ack it was sent
	// with follows the ones in force when it was sent.
	ackBefore := d.protocol&ProtocolReplyAck != 0
	err = ValidateMessage(h, m.Payload, len(m.FDs))
	if err == nil {
		reply, err = d.dispatch(m)
	}
	if d.gone != nil {
		// A pair was abandoned while handling this message: the
		// session cannot go on with rings it no longer owns.
		return nil, false, fmt.Errorf("%v: %w", h.Request, errStopTimeout)
	}
	switch {
	case err == nil && hasOwnReply(h.Request):
		return reply, true, nil
	case err == nil && needReply && (ackBefore || d.protocol&ProtocolReplyAck != 0):
		return EncodeU64(d.out[:0], 0), true, nil
	case err == nil:
		return nil, false, nil
	}

	reason := classify(err)
	d.stats.countError(reason)
	unsupported := errors.Is(err, ErrUnsupported)
	// A request the front-end waits a reply for is refused in the reply's
	// own failure encoding (NEED_REPLY changes nothing for it); where the
	// spec defines none, the connection goes. Other requests report
	// failure in an ack when one was asked for.
	if fr, ok := failureReply(h.Request, d.out[:0]); ok {
		d.warn("vhost-user request failed", "request", h.Request, "reason", reason, "err", err)
		return fr, true, nil
	}
	canAck := needReply && !expectsReply(h.Request) && (d.protocol&ProtocolReplyAck != 0 || unsupported)
	switch {
	case canAck:
		d.warn("vhost-user request failed", "request", h.Request, "reason", reason, "err", err)
		return EncodeU64(d.out[:0], 1), true, nil
	case unsupported && !expectsReply(h.Request):
		d.warn("vhost-user request ignored", "request", h.Request, "err", err)
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("%v: %w", h.Request, err)
}

// warn logs a warning the front-end can provoke at will, at most once per
// warnInterval; the errors are counted in Stats regardless.
func (d *device) warn(msg string, args ...any) {
	ok, suppressed := d.warnLimit.allow(time.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	d.log.Warn(msg, args...)
}

// classify maps an error to its Stats reason.
func classify(err error) ErrorReason {
	switch {
	case errors.Is(err, ErrMalformed), errors.Is(err, ErrTruncated), errors.Is(err, ErrFDCount):
		return ErrReasonMalformed
	case errors.Is(err, ErrUnsupported):
		return ErrReasonUnsupported
	case errors.Is(err, errMemoryLimit):
		return ErrReasonMemoryLimit
	case errors.Is(err, errMemory):
		return ErrReasonMemory
	case errors.Is(err, errDataPlane):
		return ErrReasonDataPlane
	case errors.Is(err, errStopTimeout):
		return ErrReasonStopTimeout
	}
	return ErrReasonInvalid
}

// dispatch runs the handler of a validated message.
func (d *device) dispatch(m *Message) ([]byte, error) {
	p := m.Payload
	switch m.Header.Request {
	case ReqGetFeatures:
		return EncodeU64(d.out[:0], d.offered), nil
	case ReqSetFeatures:
		return nil, d.setFeatures(mustU64(p))
	case ReqGetProtocolFeatures:
		if d.offered&FeatureProtocolFeatures == 0 {
			return nil, fmt.Errorf("PROTOCOL_FEATURES not offered: %w", ErrInvalid)
		}
		return EncodeU64(d.out[:0], OfferedProtocolFeatures), nil
	case ReqSetProtocolFeatures:
		return nil, d.setProtocolFeatures(mustU64(p))
	case ReqSetOwner:
		d.owned = true
		return nil, nil
	case ReqResetOwner:
		// Deprecated; the spec recommends ignoring it or disabling the
		// rings, and warns that discarding connection state leads to bugs.
		d.disableRings()
		return nil, nil
	case ReqResetDevice:
		d.resetDevice()
		return nil, nil
	case ReqGetQueueNum:
		return EncodeU64(d.out[:0], uint64(d.pairs)), nil
	case ReqGetMaxMemSlots:
		return EncodeU64(d.out[:0], MaxMemSlots), nil
	case ReqSetMemTable:
		return nil, d.setMemTable(m)
	case ReqAddMemReg:
		return nil, d.addMemReg(m)
	case ReqRemMemReg:
		return nil, d.remMemReg(m)
	case ReqSetVringNum:
		s, _ := DecodeVringState(p)
		return nil, d.setVringNum(s)
	case ReqSetVringAddr:
		a, _ := DecodeVringAddr(p)
		return nil, d.setVringAddr(a)
	case ReqSetVringBase:
		s, _ := DecodeVringState(p)
		return nil, d.setVringBase(s)
	case ReqGetVringBase:
		s, _ := DecodeVringState(p)
		base, err := d.getVringBase(s)
		if err != nil {
			return nil, err
		}
		return VringState{Index: s.Index, Num: uint32(base)}.Encode(d.out[:0]), nil
	case ReqSetVringKick, ReqSetVringCall, ReqSetVringErr:
		return nil, d.setVringFile(m)
	case ReqSetVringEnable:
		s, _ := DecodeVringState(p)
		return nil, d.setVringEnable(s)
	case ReqSendRARP:
		return nil, d.sendRARP(p)
	case ReqSetLogBase:
		return d.setLogBase(m)
	case ReqSetLogFD:
		return nil, d.setLogFD()
	case ReqSetDeviceStateFD:
		return d.setDeviceStateFD(m)
	case ReqCheckDeviceState:
		return d.checkDeviceState()
	case ReqNetSetMTU:
		return nil, d.setMTU(mustU64(p))
	case ReqSetStatus:
		v := mustU64(p)
		if v > 0xff {
			return nil, fmt.Errorf("status %#x: %w", v, ErrInvalid)
		}
		d.status = uint8(v)
		return nil, nil
	case ReqGetStatus:
		return EncodeU64(d.out[:0], uint64(d.status)), nil
	}
	return nil, fmt.Errorf("%v: %w", m.Header.Request, ErrUnsupported)
}

// mustU64 decodes a payload ValidateMessage already sized.
func mustU64(p []byte) uint64 {
	v, _ := DecodeU64(p)
	return v
}

func (d *device) setFeatures(f uint64) error {
	if extra := f &^ d.offered; extra != 0 {
		return fmt.Errorf("set features %#x: bits %#x not offered: %w", f, extra, ErrInvalid)
	}
	if f == d.features {
		return nil
	}
	// Queue construction (EVENT_IDX, INDIRECT) and the enable state
	// (PROTOCOL_FEATURES) depend on the features: rebuild running pairs.
	d.stopAll()
	logAll := (d.features^f)&FeatureLogAll != 0
	d.features = f
	d.stats.Features.Store(f)
	if logAll {
		d.logAllChanged()
	}
	d.log.Info("vhost-user features negotiated", "features", fmt.Sprintf("%#x", f))
	return d.startAll()
}

func (d *device) setProtocolFeatures(f uint64) error {
	if d.offered&FeatureProtocolFeatures == 0 {
		return fmt.Errorf("PROTOCOL_FEATURES not offered: %w", ErrInvalid)
	}
	if extra := f &^ OfferedProtocolFeatures; extra != 0 {
		return fmt.Errorf("set protocol features %#x: bits %#x not offered: %w", f, extra, ErrInvalid)
	}
	d.protocol = f
	d.stats.ProtocolFeatures.Store(f)
	return nil
}

func (d *device) setMTU(v uint64) error {
	// 68 is IPv4's minimum; virtio-net's mtu field is 16 bits.
	if v < 68 || v > 65535 {
		return fmt.Errorf("mtu %d: %w", v, ErrInvalid)
	}
	d.mtu = int(v)
	if s, ok := d.dp.(virtqueue.MTUSetter); ok {
		s.SetMTU(d.mtu)
	}
	d.log.Info("vhost-user MTU set", "mtu", d.mtu)
	return nil
}

func (d *device) sendRARP(p []byte) error {
	var mac [6]byte
	copy(mac[:], p)
	a, ok := d.dp.(virtqueue.Announcer)
	if !ok {
		d.log.Info("vhost-user SEND_RARP ignored: data plane cannot announce", "mac", fmt.Sprintf("% x", mac))
		return nil
	}
	a.Announce(mac)
	return nil
}

// close releases everything the session holds: stops the data plane first,
// then closes descriptors and unmaps memory.
func (d *device) close() {
	d.stopAll()
	d.endSession()
	defer func() {
		if d.gone != nil {
			d.stuck.keep(d.gone, d)
			d.gone = nil
		}
	}()
	for i := range d.rings {
		d.rings[i].closeFDs()
		d.rings[i].reset()
	}
	d.unmapSlots(d.slots)
	d.slots = nil
	d.stats.GuestMemory.Store(0)
	d.mem, _ = virtqueue.NewMemory(nil)
	d.unmapLog(d.dirtyLog)
	d.dirtyLog = nil
	d.stats.Features.Store(0)
	d.stats.ProtocolFeatures.Store(0)
}

// endSession tells the data plane that the guest's state is gone; the pairs
// are stopped by then.
func (d *device) endSession() {
	if d.gone != nil || d.stuck.stuck(-1) {
		d.log.Warn("data plane session not ended: an abandoned queue pair may still use its state")
		return
	}
	if e, ok := d.dp.(virtqueue.SessionEnder); ok {
		e.EndSession()
	}
}

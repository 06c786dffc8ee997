package vhostuser

import (
	"encoding/binary"
	"errors"
	"fmt"

	"vunet/virtqueue"
)

// Request is a front-end message type (the header's request field).
type Request uint32

// Front-end request codes, numbered as in QEMU's docs/interop/vhost-user.rst.
const (
	ReqNone                Request = 0
	ReqGetFeatures         Request = 1
	ReqSetFeatures         Request = 2
	ReqSetOwner            Request = 3
	ReqResetOwner          Request = 4
	ReqSetMemTable         Request = 5
	ReqSetLogBase          Request = 6
	ReqSetLogFD            Request = 7
	ReqSetVringNum         Request = 8
	ReqSetVringAddr        Request = 9
	ReqSetVringBase        Request = 10
	ReqGetVringBase        Request = 11
	ReqSetVringKick        Request = 12
	ReqSetVringCall        Request = 13
	ReqSetVringErr         Request = 14
	ReqGetProtocolFeatures Request = 15
	ReqSetProtocolFeatures Request = 16
	ReqGetQueueNum         Request = 17
	ReqSetVringEnable      Request = 18
	ReqSendRARP            Request = 19
	ReqNetSetMTU           Request = 20
	ReqSetBackendReqFD     Request = 21
	ReqIOTLBMsg            Request = 22
	ReqSetVringEndian      Request = 23
	ReqGetConfig           Request = 24
	ReqSetConfig           Request = 25
	ReqCreateCryptoSession Request = 26
	ReqCloseCryptoSession  Request = 27
	ReqPostcopyAdvise      Request = 28
	ReqPostcopyListen      Request = 29
	ReqPostcopyEnd         Request = 30
	ReqGetInflightFD       Request = 31
	ReqSetInflightFD       Request = 32
	ReqGPUSetSocket        Request = 33
	ReqResetDevice         Request = 34
	ReqVringKick           Request = 35
	ReqGetMaxMemSlots      Request = 36
	ReqAddMemReg           Request = 37
	ReqRemMemReg           Request = 38
	ReqSetStatus           Request = 39
	ReqGetStatus           Request = 40
	ReqGetSharedObject     Request = 41
	ReqSetDeviceStateFD    Request = 42
	ReqCheckDeviceState    Request = 43

	// NumRequests bounds the request codes this package knows; codes at or
	// above it are counted as ReqNone in Stats.
	NumRequests = 44
)

var requestNames = [NumRequests]string{
	"NONE", "GET_FEATURES", "SET_FEATURES", "SET_OWNER", "RESET_OWNER",
	"SET_MEM_TABLE", "SET_LOG_BASE", "SET_LOG_FD", "SET_VRING_NUM",
	"SET_VRING_ADDR", "SET_VRING_BASE", "GET_VRING_BASE", "SET_VRING_KICK",
	"SET_VRING_CALL", "SET_VRING_ERR", "GET_PROTOCOL_FEATURES",
	"SET_PROTOCOL_FEATURES", "GET_QUEUE_NUM", "SET_VRING_ENABLE", "SEND_RARP",
	"NET_SET_MTU", "SET_BACKEND_REQ_FD", "IOTLB_MSG", "SET_VRING_ENDIAN",
	"GET_CONFIG", "SET_CONFIG", "CREATE_CRYPTO_SESSION",
	"CLOSE_CRYPTO_SESSION", "POSTCOPY_ADVISE", "POSTCOPY_LISTEN",
	"POSTCOPY_END", "GET_INFLIGHT_FD", "SET_INFLIGHT_FD", "GPU_SET_SOCKET",
	"RESET_DEVICE", "VRING_KICK", "GET_MAX_MEM_SLOTS", "ADD_MEM_REG",
	"REM_MEM_REG", "SET_STATUS", "GET_STATUS", "GET_SHARED_OBJECT",
	"SET_DEVICE_STATE_FD", "CHECK_DEVICE_STATE",
}

// String returns the spec's name without the VHOST_USER_ prefix.
func (r Request) String() string {
	if r < NumRequests {
		return requestNames[r]
	}
	return fmt.Sprintf("UNKNOWN(%d)", uint32(r))
}

// Header flag bits.
const (
	FlagVersionMask uint32 = 0x3
	FlagVersion1    uint32 = 0x1
	FlagReply       uint32 = 0x4
	FlagNeedReply   uint32 = 0x8
	flagsKnown             = FlagVersionMask | FlagReply | FlagNeedReply
)

// HeaderSize is the fixed size of a message header in bytes.
const HeaderSize = 12

// MaxPayloadSize bounds the payload this package reads. The largest payload
// of any defined message is a config-space access (12+256 bytes); the rest
// of the bound leaves room to skip unknown messages without losing framing.
const MaxPayloadSize = 4096

// MaxFDs is the most file descriptors one message may carry (the memory table
// has eight slots; QEMU never sends more).
const MaxFDs = 8

// MaxMemRegions is the number of regions in a SET_MEM_TABLE payload.
const MaxMemRegions = 8

// Header is a message header. Multi-byte fields are little-endian on the
// wire: the spec says "native", and every platform vunet runs on is
// little-endian.
type Header struct {
	Request Request
	Flags   uint32
	Size    uint32
}

// Encode writes the header into b[:HeaderSize].
func (h Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint32(b[0:], uint32(h.Request))
	binary.LittleEndian.PutUint32(b[4:], h.Flags)
	binary.LittleEndian.PutUint32(b[8:], h.Size)
}

// DecodeHeader parses and checks a header: version 1, no reply flag, no
// unknown flag bits, payload size within MaxPayloadSize.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("header: %d bytes: %w", len(b), ErrTruncated)
	}
	h := Header{
		Request: Request(binary.LittleEndian.Uint32(b[0:])),
		Flags:   binary.LittleEndian.Uint32(b[4:]),
		Size:    binary.LittleEndian.Uint32(b[8:]),
	}
	if h.Flags&FlagVersionMask != FlagVersion1 {
		return h, fmt.Errorf("header %v: version %d: %w", h.Request, h.Flags&FlagVersionMask, ErrMalformed)
	}
	if h.Flags&FlagReply != 0 {
		return h, fmt.Errorf("header %v: reply flag on a request: %w", h.Request, ErrMalformed)
	}
	if h.Flags&^flagsKnown != 0 {
		return h, fmt.Errorf("header %v: unknown flags %#x: %w", h.Request, h.Flags, ErrMalformed)
	}
	if h.Size > MaxPayloadSize {
		return h, fmt.Errorf("header %v: payload size %d > %d: %w", h.Request, h.Size, MaxPayloadSize, ErrMalformed)
	}
	return h, nil
}

// Codec errors. Every error the decoder returns wraps one of these.
var (
	ErrMalformed = errors.New("malformed message")
	ErrTruncated = errors.New("truncated message")
	ErrFDCount   = errors.New("wrong number of file descriptors")
)

// Vhost-user feature bits (masks) that are not virtio device features; the
// virtio bits are virtqueue's Feature* bit numbers.
const (
	FeatureLogAll           = 1 << 26 // VHOST_F_LOG_ALL: dirty-page logging for live migration (dirty_log.go)
	FeatureProtocolFeatures = 1 << 30 // VHOST_USER_F_PROTOCOL_FEATURES
)

// DefaultFeatures is what the device offers unless DeviceConfig.Features
// says otherwise. PROTOCOL_FEATURES is mandatory for QEMU (FIELD-NOTES).
const DefaultFeatures uint64 = 1<<virtqueue.FeatureVersion1 | 1<<virtqueue.FeatureNetMrgRxbuf |
	1<<virtqueue.FeatureRingEventIdx | 1<<virtqueue.FeatureRingIndirectDesc |
	1<<virtqueue.FeatureNetMTU | FeatureProtocolFeatures | FeatureLogAll | OffloadFeatures

// OffloadFeatures are the checksum, TSO and USO offloads. They pass through
// QEMU to the guest: with them a guest hands over (and takes) 64 KiB TCP
// segments, and runs of UDP datagrams as one frame, with partial checksums,
// and since vunet writes payloads to host sockets and reads them back,
// neither side ever computes a checksum in software. QEMU's virtio-net
// clears the USO bits for any netdev but tap (peer_has_uso: the vhost-user
// netdev reports no USO), so a QEMU guest takes TSO only; other front-ends
// (DPDK's virtio-user, the rig) see them.
const OffloadFeatures uint64 = 1<<virtqueue.FeatureNetCsum | 1<<virtqueue.FeatureNetGuestCsum |
	1<<virtqueue.FeatureNetHostTSO4 | 1<<virtqueue.FeatureNetHostTSO6 |
	1<<virtqueue.FeatureNetGuestTSO4 | 1<<virtqueue.FeatureNetGuestTSO6 |
	1<<virtqueue.FeatureNetHostUSO | 1<<virtqueue.FeatureNetGuestUSO4 | 1<<virtqueue.FeatureNetGuestUSO6

// Protocol feature bits (SET_PROTOCOL_FEATURES).
const (
	ProtocolMQ                  = 1 << 0
	ProtocolLogSHMFD            = 1 << 1
	ProtocolRARP                = 1 << 2
	ProtocolReplyAck            = 1 << 3
	ProtocolNetMTU              = 1 << 4
	ProtocolBackendReq          = 1 << 5
	ProtocolCrossEndian         = 1 << 6
	ProtocolCryptoSession       = 1 << 7
	ProtocolPagefault           = 1 << 8
	ProtocolConfig              = 1 << 9
	ProtocolBackendSendFD       = 1 << 10
	ProtocolHostNotifier        = 1 << 11
	ProtocolInflightSHMFD       = 1 << 12
	ProtocolResetDevice         = 1 << 13
	ProtocolInbandNotifications = 1 << 14
	ProtocolConfigureMemSlots   = 1 << 15
	ProtocolStatus              = 1 << 16
	ProtocolXenMmap             = 1 << 17
	ProtocolSharedObject        = 1 << 18
	ProtocolDeviceState         = 1 << 19
)

// OfferedProtocolFeatures is the protocol feature set the device offers.
const OfferedProtocolFeatures uint64 = ProtocolReplyAck | ProtocolMQ | ProtocolConfigureMemSlots |
	ProtocolNetMTU | ProtocolRARP | ProtocolStatus | ProtocolResetDevice | ProtocolLogSHMFD | ProtocolDeviceState

// VringFlagLog is VHOST_VRING_F_LOG in SET_VRING_ADDR's flags: log
// writes to the used ring, at the address's log field, while
// VHOST_F_LOG_ALL is negotiated (live migration).
const VringFlagLog = 1 << 0

// Vring file payload (SET_VRING_KICK/CALL/ERR) bits.
const (
	VringIndexMask = 0xff
	VringNoFDFlag  = 0x100
)

// Payload sizes on the wire.
const (
	sizeU64        = 8
	sizeVringState = 8
	sizeVringAddr  = 40
	sizeMemRegion  = 32
	sizeMemTableHd = 8
	sizeMemTable   = sizeMemTableHd + MaxMemRegions*sizeMemRegion
	sizeMemRegMsg  = 8 + sizeMemRegion
)

// VringState is the vring state description: an index and a number (ring
// size, base, or enable flag depending on the request).
type VringState struct {
	Index uint32
	Num   uint32
}

// Encode appends the wire form of s to b.
func (s VringState) Encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, s.Index)
	return binary.LittleEndian.AppendUint32(b, s.Num)
}

// DecodeVringState parses a vring state description; the payload must be
// exactly 8 bytes.
func DecodeVringState(p []byte) (VringState, error) {
	if len(p) != sizeVringState {
		return VringState{}, fmt.Errorf("vring state: %d bytes: %w", len(p), ErrMalformed)
	}
	return VringState{Index: binary.LittleEndian.Uint32(p), Num: binary.LittleEndian.Uint32(p[4:])}, nil
}

// VringAddr is the vring address description of SET_VRING_ADDR. Ring
// addresses are front-end virtual addresses.
type VringAddr struct {
	Index uint32
	Flags uint32 // bit 0: VHOST_VRING_F_LOG
	Desc  uint64
	Used  uint64
	Avail uint64
	Log   uint64 // guest address for dirty logging
}

// Encode appends the wire form of a to b.
func (a VringAddr) Encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, a.Index)
	b = binary.LittleEndian.AppendUint32(b, a.Flags)
	b = binary.LittleEndian.AppendUint64(b, a.Desc)
	b = binary.LittleEndian.AppendUint64(b, a.Used)
	b = binary.LittleEndian.AppendUint64(b, a.Avail)
	return binary.LittleEndian.AppendUint64(b, a.Log)
}

// DecodeVringAddr parses a vring address description (exactly 40 bytes).
func DecodeVringAddr(p []byte) (VringAddr, error) {
	if len(p) != sizeVringAddr {
		return VringAddr{}, fmt.Errorf("vring addr: %d bytes: %w", len(p), ErrMalformed)
	}
	le := binary.LittleEndian
	return VringAddr{
		Index: le.Uint32(p), Flags: le.Uint32(p[4:]),
		Desc: le.Uint64(p[8:]), Used: le.Uint64(p[16:]), Avail: le.Uint64(p[24:]), Log: le.Uint64(p[32:]),
	}, nil
}

// MemRegion is one memory region description.
type MemRegion struct {
	GuestAddr  uint64
	Size       uint64
	UserAddr   uint64
	MmapOffset uint64
}

// Encode appends the wire form of r to b.
func (r MemRegion) Encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, r.GuestAddr)
	b = binary.LittleEndian.AppendUint64(b, r.Size)
	b = binary.LittleEndian.AppendUint64(b, r.UserAddr)
	return binary.LittleEndian.AppendUint64(b, r.MmapOffset)
}

func decodeMemRegion(p []byte) MemRegion {
	le := binary.LittleEndian
	return MemRegion{GuestAddr: le.Uint64(p), Size: le.Uint64(p[8:]), UserAddr: le.Uint64(p[16:]), MmapOffset: le.Uint64(p[24:])}
}

// EncodeMemTable appends a SET_MEM_TABLE payload (header plus the given
// regions only, as QEMU sends it) to b.
func EncodeMemTable(b []byte, regions []MemRegion) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(regions)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	for _, r := range regions {
		b = r.Encode(b)
	}
	return b
}

// DecodeMemTable parses a SET_MEM_TABLE payload. The payload may hold just
// the used regions (QEMU, DPDK) or the full eight-slot array.
func DecodeMemTable(p []byte) ([]MemRegion, error) {
	if len(p) < sizeMemTableHd {
		return nil, fmt.Errorf("mem table: %d bytes: %w", len(p), ErrMalformed)
	}
	n := binary.LittleEndian.Uint32(p)
	if n > MaxMemRegions {
		return nil, fmt.Errorf("mem table: %d regions > %d: %w", n, MaxMemRegions, ErrMalformed)
	}
	if want := sizeMemTableHd + int(n)*sizeMemRegion; len(p) != want && len(p) != sizeMemTable {
		return nil, fmt.Errorf("mem table: %d regions in %d bytes: %w", n, len(p), ErrMalformed)
	}
	regions := make([]MemRegion, n)
	for i := range regions {
		regions[i] = decodeMemRegion(p[sizeMemTableHd+i*sizeMemRegion:])
	}
	return regions, nil
}

// EncodeMemRegMsg appends an ADD_MEM_REG / REM_MEM_REG payload to b.
func EncodeMemRegMsg(b []byte, r MemRegion) []byte {
	b = binary.LittleEndian.AppendUint64(b, 0)
	return r.Encode(b)
}

// DecodeMemRegMsg parses the single memory region description of
// ADD_MEM_REG and REM_MEM_REG (u64 padding, then one region; 40 bytes).
func DecodeMemRegMsg(p []byte) (MemRegion, error) {
	if len(p) != sizeMemRegMsg {
		return MemRegion{}, fmt.Errorf("mem region: %d bytes: %w", len(p), ErrMalformed)
	}
	return decodeMemRegion(p[8:]), nil
}

// EncodeU64 appends a u64 payload to b.
func EncodeU64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

// DecodeU64 parses a u64 payload (exactly 8 bytes).
func DecodeU64(p []byte) (uint64, error) {
	if len(p) != sizeU64 {
		return 0, fmt.Errorf("u64: %d bytes: %w", len(p), ErrMalformed)
	}
	return binary.LittleEndian.Uint64(p), nil
}

// payloadKind says how a request's payload is laid out, for size checks.
type payloadKind uint8

const (
	payloadAny         payloadKind = iota // unsupported request: any size up to MaxPayloadSize
	payloadNone                           // no payload
	payloadU64                            // u64
	payloadVringState                     // vring state description
	payloadVringAddr                      // vring address description
	payloadMemTable                       // memory regions description
	payloadMemReg                         // single memory region description
	payloadLog                            // log description and the log's fd
	payloadDeviceState                    // device state transfer parameters and the channel's fd
	payloadFD                             // no payload, one fd
)

// payloadKindOf returns the payload layout of a request the device handles.
func payloadKindOf(r Request) payloadKind {
	switch r {
	case ReqGetFeatures, ReqSetOwner, ReqResetOwner, ReqGetProtocolFeatures, ReqGetQueueNum,
		ReqResetDevice, ReqGetMaxMemSlots, ReqGetStatus:
		return payloadNone
	case ReqSetFeatures, ReqSetProtocolFeatures, ReqSetVringKick, ReqSetVringCall, ReqSetVringErr,
		ReqSendRARP, ReqNetSetMTU, ReqSetStatus:
		return payloadU64
	case ReqSetVringNum, ReqSetVringBase, ReqGetVringBase, ReqSetVringEnable:
		return payloadVringState
	case ReqSetVringAddr:
		return payloadVringAddr
	case ReqSetMemTable:
		return payloadMemTable
	case ReqAddMemReg, ReqRemMemReg:
		return payloadMemReg
	case ReqSetLogBase:
		return payloadLog
	case ReqSetLogFD:
		return payloadFD
	case ReqSetDeviceStateFD:
		return payloadDeviceState
	case ReqCheckDeviceState:
		return payloadNone
	}
	return payloadAny
}

// hasOwnReply reports whether a request is answered with its own reply
// payload (so REPLY_ACK adds nothing).
func hasOwnReply(r Request) bool {
	switch r {
	case ReqGetFeatures, ReqGetProtocolFeatures, ReqGetVringBase, ReqGetQueueNum,
		ReqGetMaxMemSlots, ReqGetStatus, ReqSetLogBase, ReqSetDeviceStateFD, ReqCheckDeviceState:
		return true
	}
	return false
}

// expectsReply reports whether the front-end waits for a reply to r even
// without NEED_REPLY. Ignoring such a request would hang the front-end, so
// an unsupported one closes the connection instead.
func expectsReply(r Request) bool {
	switch r {
	case ReqIOTLBMsg, ReqGetConfig, ReqCreateCryptoSession, ReqPostcopyAdvise, ReqPostcopyEnd,
		ReqGetInflightFD, ReqGetSharedObject, ReqSetDeviceStateFD, ReqCheckDeviceState:
		return true
	}
	return hasOwnReply(r)
}

// failureReply returns the reply that tells the front-end a request it
// waits on failed, for the requests whose reply has a failure encoding in
// the spec (appended to out); ok is false for the others, which can only
// be refused by closing the connection.
func failureReply(r Request, out []byte) (reply []byte, ok bool) {
	switch r {
	case ReqGetConfig:
		// "vhost-user back-end uses zero length of payload to indicate
		// an error".
		return out[:0], true
	case ReqIOTLBMsg, ReqPostcopyEnd, ReqCheckDeviceState:
		// u64: zero on success, non-zero on failure.
		return EncodeU64(out[:0], 1), true
	case ReqSetDeviceStateFD:
		// u64: bits 0-7 non-zero on error, bit 8 set (no fd returned;
		// an error must not come with one).
		return EncodeU64(out[:0], 1|VringNoFDFlag), true
	case ReqGetSharedObject:
		// Success is a reply carrying the dma-buf fd, failure one without
		// (QEMU looks only at the fd). The payload is a non-zero u64 so
		// that a front-end reading it as an ack sees a failure too.
		return EncodeU64(out[:0], 1), true
	}
	return nil, false
}

// ValidateMessage checks a request's payload size and file-descriptor count
// against what the request carries. It never looks at device state.
func ValidateMessage(h Header, payload []byte, nfds int) error {
	if int(h.Size) != len(payload) {
		return fmt.Errorf("%v: header says %d bytes, got %d: %w", h.Request, h.Size, len(payload), ErrTruncated)
	}
	if nfds > MaxFDs {
		return fmt.Errorf("%v: %d fds: %w", h.Request, nfds, ErrFDCount)
	}
	wantFDs := 0
	switch payloadKindOf(h.Request) {
	case payloadNone:
		if len(payload) != 0 {
			return fmt.Errorf("%v: unexpected %d-byte payload: %w", h.Request, len(payload), ErrMalformed)
		}
	case payloadU64:
		v, err := DecodeU64(payload)
		if err != nil {
			return fmt.Errorf("%v: %w", h.Request, err)
		}
		switch h.Request {
		case ReqSetVringKick, ReqSetVringCall, ReqSetVringErr:
			if v&VringNoFDFlag == 0 {
				wantFDs = 1
			}
		}
	case payloadVringState:
		if len(payload) != sizeVringState {
			return fmt.Errorf("%v: %d bytes: %w", h.Request, len(payload), ErrMalformed)
		}
	case payloadVringAddr:
		if len(payload) != sizeVringAddr {
			return fmt.Errorf("%v: %d bytes: %w", h.Request, len(payload), ErrMalformed)
		}
	case payloadMemTable:
		regions, err := DecodeMemTable(payload)
		if err != nil {
			return fmt.Errorf("%v: %w", h.Request, err)
		}
		wantFDs = len(regions)
	case payloadMemReg:
		if len(payload) != sizeMemRegMsg {
			return fmt.Errorf("%v: %d bytes: %w", h.Request, len(payload), ErrMalformed)
		}
		if h.Request == ReqAddMemReg {
			wantFDs = 1
		} else if nfds <= 1 {
			// The spec lets REM_MEM_REG carry one stray fd, which is closed.
			wantFDs = nfds
		}
	case payloadLog:
		if len(payload) != sizeLog {
			return fmt.Errorf("%v: %d bytes: %w", h.Request, len(payload), ErrMalformed)
		}
		wantFDs = 1
	case payloadDeviceState:
		if len(payload) != sizeDeviceState {
			return fmt.Errorf("%v: %d bytes: %w", h.Request, len(payload), ErrMalformed)
		}
		wantFDs = 1
	case payloadFD:
		if len(payload) != 0 {
			return fmt.Errorf("%v: unexpected %d-byte payload: %w", h.Request, len(payload), ErrMalformed)
		}
		wantFDs = 1
	case payloadAny:
		return nil
	}
	if nfds != wantFDs {
		return fmt.Errorf("%v: %d fds, want %d: %w", h.Request, nfds, wantFDs, ErrFDCount)
	}
	return nil
}

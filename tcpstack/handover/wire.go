package handover

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the hand-over protocol's version. Both ends must speak the
// same: the flows' state is the two tables' own encoding, which only the
// same vunet reads back.
const Version = 1

// Item is one flow as the source hands it over.
type Item struct {
	Kind Kind   // which table exported it, and imports it
	Pair uint16 // the queue pair it belongs to
	Data []byte // the table's encoding of the flow's state
	FD   int    // its host socket; -1: none
}

// Kind says which table an Item belongs to.
type Kind uint8

// Item kinds.
const (
	KindTCP   Kind = 1 // a TCP connection (tcpstack/tcp)
	KindDgram Kind = 2 // a UDP or ICMP echo flow (tcpstack/dgram)
	numKinds       = 3
)

// Bounds on what is read. A message is at most MaxMessageSize bytes, well
// within a UNIX socket's default buffer, so a SOCK_SEQPACKET send never
// fails for its size.
const (
	MaxItemSize        = 1024
	MaxItemsPerMessage = 128
	MaxFDsPerMessage   = 128 // SCM_RIGHTS takes at most 253
	MaxItems           = 1 << 20
	MaxMessageSize     = headerSize + MaxItemsPerMessage*(itemHeaderSize+MaxItemSize)
)

// Message types.
type msgType uint8

const (
	msgHello  msgType = 1
	msgState  msgType = 2
	msgEnd    msgType = 3
	msgAbort  msgType = 4
	msgCommit msgType = 5
)

func (t msgType) String() string {
	switch t {
	case msgHello:
		return "HELLO"
	case msgState:
		return "STATE"
	case msgEnd:
		return "END"
	case msgAbort:
		return "ABORT"
	case msgCommit:
		return "COMMIT"
	}
	return fmt.Sprintf("type %d", uint8(t))
}

// Wire layout, little-endian:
//
//	header: u32 magic "VMIG", u8 type, u8 0, u16 version, u32 count, u32 payload length
//	STATE payload: count items of  u8 kind, u8 flags (bit 0: has a socket), u16 pair, u32 length, data
//	END: count is the number of items of all STATE messages before it
const (
	magic          = 0x47494d56 // "VMIG"
	headerSize     = 16
	itemHeaderSize = 8
	itemHasFD      = 1
)

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed hand-over message")

// message is one decoded message. Items' Data alias the decoded bytes.
type message struct {
	typ     msgType
	version uint16
	count   uint32
	items   []Item
	withFD  int // items that carry a socket
}

func appendHeader(b []byte, t msgType, count uint32, payload int) []byte {
	b = binary.LittleEndian.AppendUint32(b, magic)
	b = append(b, byte(t), 0)
	b = binary.LittleEndian.AppendUint16(b, Version)
	b = binary.LittleEndian.AppendUint32(b, count)
	return binary.LittleEndian.AppendUint32(b, uint32(payload))
}

// encodeState appends a STATE message carrying items (at most
// MaxItemsPerMessage, each at most MaxItemSize bytes) to b; the sockets of
// the items that have one go with it, in order.
func encodeState(b []byte, items []Item) ([]byte, error) {
	if len(items) > MaxItemsPerMessage {
		return b, fmt.Errorf("%d items in one message: %w", len(items), ErrMalformed)
	}
	size := 0
	for _, it := range items {
		if len(it.Data) > MaxItemSize || it.Kind == 0 || it.Kind >= numKinds {
			return b, fmt.Errorf("item of kind %d, %d bytes: %w", it.Kind, len(it.Data), ErrMalformed)
		}
		size += itemHeaderSize + len(it.Data)
	}
	b = appendHeader(b, msgState, uint32(len(items)), size)
	for _, it := range items {
		var flags byte
		if it.FD >= 0 {
			flags = itemHasFD
		}
		b = append(b, byte(it.Kind), flags)
		b = binary.LittleEndian.AppendUint16(b, it.Pair)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(it.Data)))
		b = append(b, it.Data...)
	}
	return b, nil
}

// decode parses one message read whole. It checks everything but the
// descriptors, whose count the caller compares with withFD.
func decode(b []byte) (message, error) {
	var m message
	if len(b) < headerSize {
		return m, fmt.Errorf("%d bytes: %w", len(b), ErrMalformed)
	}
	le := binary.LittleEndian
	if le.Uint32(b) != magic || b[5] != 0 {
		return m, fmt.Errorf("bad magic: %w", ErrMalformed)
	}
	m.typ, m.version, m.count = msgType(b[4]), le.Uint16(b[6:]), le.Uint32(b[8:])
	if m.version != Version {
		return m, fmt.Errorf("%v: version %d, this vunet speaks %d: %w", m.typ, m.version, Version, ErrMalformed)
	}
	payload := b[headerSize:]
	if int(le.Uint32(b[12:])) != len(payload) {
		return m, fmt.Errorf("%v: payload length %d in a %d-byte message: %w", m.typ, le.Uint32(b[12:]), len(b), ErrMalformed)
	}
	switch m.typ {
	case msgHello, msgAbort, msgCommit:
		if m.count != 0 || len(payload) != 0 {
			return m, fmt.Errorf("%v with a payload: %w", m.typ, ErrMalformed)
		}
		return m, nil
	case msgEnd:
		if len(payload) != 0 || m.count > MaxItems {
			return m, fmt.Errorf("END: %d items, %d payload bytes: %w", m.count, len(payload), ErrMalformed)
		}
		return m, nil
	case msgState:
	default:
		return m, fmt.Errorf("%v: %w", m.typ, ErrMalformed)
	}
	if m.count == 0 || m.count > MaxItemsPerMessage {
		return m, fmt.Errorf("STATE with %d items: %w", m.count, ErrMalformed)
	}
	m.items = make([]Item, 0, m.count)
	for i := uint32(0); i < m.count; i++ {
		if len(payload) < itemHeaderSize {
			return m, fmt.Errorf("STATE item %d truncated: %w", i, ErrMalformed)
		}
		kind, flags, pair, n := Kind(payload[0]), payload[1], le.Uint16(payload[2:]), le.Uint32(payload[4:])
		if kind == 0 || kind >= numKinds || flags&^itemHasFD != 0 || n > MaxItemSize || int(n) > len(payload)-itemHeaderSize {
			return m, fmt.Errorf("STATE item %d: kind %d, flags %#x, %d bytes: %w", i, kind, flags, n, ErrMalformed)
		}
		it := Item{Kind: kind, Pair: pair, Data: payload[itemHeaderSize : itemHeaderSize+n], FD: -1}
		if flags&itemHasFD != 0 {
			it.FD = m.withFD // index into the message's descriptors until resolved
			m.withFD++
		}
		m.items = append(m.items, it)
		payload = payload[itemHeaderSize+n:]
	}
	if len(payload) != 0 {
		return m, fmt.Errorf("STATE: %d bytes after the last item: %w", len(payload), ErrMalformed)
	}
	if m.withFD > MaxFDsPerMessage {
		return m, fmt.Errorf("STATE with %d sockets: %w", m.withFD, ErrMalformed)
	}
	return m, nil
}

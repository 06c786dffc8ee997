package handover

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The state as one byte stream, without sockets: what a vunet hands QEMU
// through the vhost-user device-state channel (SET_DEVICE_STATE_FD), which
// QEMU carries in its own migration stream to the destination's vunet,
// perhaps on another host. The sockets cannot travel that way: a TCP
// connection's item then holds its socket's whole state (tcpstack/hostsock
// TCP repair) for the destination to make a new socket from.
//
//	u32 magic "VMIS", u16 version, u16 0, u32 item count,
//	per item: u8 kind, u8 0, u16 pair, u32 length, data

const streamMagic = 0x53494d56 // "VMIS"

// Bounds of what ReadStream takes: an item holds at most a connection's
// two queues and its state.
const (
	MaxStreamItemSize = 40 << 20
	MaxStreamBytes    = 1 << 30
)

// WriteStream writes items (their FD fields are ignored) to w.
func WriteStream(w io.Writer, items []Item) error {
	bw := bufio.NewWriter(w)
	le := binary.LittleEndian
	var h [12]byte
	le.PutUint32(h[:], streamMagic)
	le.PutUint16(h[4:], Version)
	le.PutUint32(h[8:], uint32(len(items)))
	if _, err := bw.Write(h[:]); err != nil {
		return err
	}
	for _, it := range items {
		if len(it.Data) > MaxStreamItemSize || it.Kind == 0 || it.Kind >= numKinds {
			return fmt.Errorf("item of kind %d, %d bytes: %w", it.Kind, len(it.Data), ErrMalformed)
		}
		var ih [8]byte
		ih[0] = byte(it.Kind)
		le.PutUint16(ih[2:], it.Pair)
		le.PutUint32(ih[4:], uint32(len(it.Data)))
		if _, err := bw.Write(ih[:]); err != nil {
			return err
		}
		if _, err := bw.Write(it.Data); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// ReadStream reads a stream WriteStream wrote, to its end: bytes after the
// last item are an error, as are bounds exceeded.
func ReadStream(r io.Reader) ([]Item, error) {
	br := bufio.NewReader(r)
	le := binary.LittleEndian
	var h [12]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return nil, fmt.Errorf("stream header: %w: %w", ErrMalformed, err)
	}
	if le.Uint32(h[:]) != streamMagic || le.Uint16(h[4:]) != Version || le.Uint16(h[6:]) != 0 {
		return nil, fmt.Errorf("stream header: magic or version: %w", ErrMalformed)
	}
	n := le.Uint32(h[8:])
	if n > MaxItems {
		return nil, fmt.Errorf("%d items: %w", n, ErrMalformed)
	}
	var items []Item
	total := 0
	for i := uint32(0); i < n; i++ {
		var ih [8]byte
		if _, err := io.ReadFull(br, ih[:]); err != nil {
			return nil, fmt.Errorf("item %d: %w: %w", i, ErrMalformed, err)
		}
		kind, size := Kind(ih[0]), le.Uint32(ih[4:])
		if kind == 0 || kind >= numKinds || ih[1] != 0 || size > MaxStreamItemSize || total+int(size) > MaxStreamBytes {
			return nil, fmt.Errorf("item %d: kind %d, %d bytes: %w", i, kind, size, ErrMalformed)
		}
		total += int(size)
		data := make([]byte, size)
		if _, err := io.ReadFull(br, data); err != nil {
			return nil, fmt.Errorf("item %d: %w: %w", i, ErrMalformed, err)
		}
		items = append(items, Item{Kind: kind, Pair: le.Uint16(ih[2:]), Data: data, FD: -1})
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("bytes after the last item: %w", ErrMalformed)
	}
	return items, nil
}
